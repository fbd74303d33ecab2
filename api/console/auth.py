"""Sign-in for the console when the brokers have access control on (``docs/security.md``).

The console decides nothing about permissions: a signed-in user's admin calls go through an
:class:`~sparkmq.platform.client.admin.AdminClient` signed with that user's own credentials, so the brokers
decide and refuse (NO_PERMISSION, shown as the broker wrote it).  This module only

* finds out whether ACL is on (an unsigned ``GET /acl/whoami`` is refused when it is; cached a few seconds);
* checks an access key and secret key at sign-in (a signed ``whoami`` on every master);
* keeps sessions server-side: the browser holds a random id in an HttpOnly cookie, the secret stays here and
  is never answered or logged;
* answers "may this user ...?" from the user's policy entries with the platform's own decision
  (:meth:`~sparkmq.platform.auth.AclTable.decide`), so the page hides what the brokers would refuse anyway.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...platform.auth import AclTable, Action, Decision, Policy, PolicyEntry, Resource, ResourceType, User
from ...platform.client.admin import AdminClient
from ...platform.common.errors import ErrorCode, SparkMQError

__all__ = ["ConsoleAuth", "Session", "COOKIE", "SESSION_IDLE_S"]

log = logging.getLogger("sparkmq.console")

#: The session cookie's name (its value: a random id; HttpOnly, SameSite=Strict).
COOKIE = "sparkmq_console_session"
#: A session unused this long is forgotten (the user signs in again).
SESSION_IDLE_S = 8 * 3600.0
#: How long the answer to "is ACL on?" is reused.
_PROBE_TTL_S = 5.0
#: Refusals that mean "ACL is on and this request was not signed by someone allowed".
_ACL_CODES = (ErrorCode.AUTHENTICATION_FAILED, ErrorCode.NO_PERMISSION)


@dataclass
class Session:
    """One signed-in user: their admin client (signed with their keys) and their policy, for the page."""

    sid: str
    access_key: str
    super_user: bool
    entries: list[dict[str, Any]]
    admin: AdminClient
    table: AclTable = field(repr=False)
    peer_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    last_used: float = field(default_factory=time.monotonic)

    def may(self, action: Action, resource: Resource) -> bool:
        """Whether the brokers would allow ``action`` on ``resource`` (the user's policy as a master answered it)."""
        return self.table.decide(self.access_key, action, resource, self.peer_ip) is Decision.ALLOW

    def may_create_topics(self) -> bool:
        """Whether some topic may be created (which one depends on its name: the brokers decide at create)."""
        if self.super_user:
            return True
        policy = self.table.policies.get(self.access_key)
        if policy is None:  # a user without a policy may do nothing
            return False
        return any(e.decision is Decision.ALLOW and Action.CREATE in e.actions
                   and e.resource.type in (None, ResourceType.TOPIC) for e in policy.entries)

    def view(self) -> dict[str, Any]:
        """What the page is told: never the secret."""
        return {"access_key": self.access_key, "super_user": self.super_user, "entries": self.entries}


class ConsoleAuth:
    """Whether ACL is on, and the console's sessions.  Thread-safe.

    ``make_admin(access_key, secret_key)`` builds a signed admin client (the base client's config with those
    credentials); the base client (unsigned) only probes whether ACL is on.
    """

    def __init__(self, base: AdminClient, make_admin: Callable[[str, str], AdminClient] | None = None,
                 *, idle_s: float = SESSION_IDLE_S, on_drop: Callable[[AdminClient], None] | None = None) -> None:
        """``on_drop(admin)`` runs before a session's client is closed (the sampler stops using it)."""
        self._base = base
        self._on_drop = on_drop
        self._make_admin = make_admin or (lambda ak, sk: AdminClient(
            dataclasses.replace(base.config, access_key=ak, secret_key=sk)))
        self._idle_s = idle_s
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._acl: bool = False
        self._probed_at = float("-inf")

    # -- is ACL on? ---------------------------------------------------------------------------------
    def acl_enabled(self) -> bool:
        """True when any master (or the name servers) refuses unsigned requests; re-asked every few seconds.

        A cluster that does not answer keeps the last answer (the brokers refuse unsigned calls anyway).
        """
        now = time.monotonic()
        if now - self._probed_at < _PROBE_TTL_S:
            return self._acl
        try:
            answers = self._base.whoami()
            self._acl = any(a.get("acl_enabled") for a in answers.values())
        except SparkMQError as exc:
            if exc.code in _ACL_CODES:
                self._acl = True
            else:
                log.debug("cannot tell whether ACL is on: %s", exc)
        self._probed_at = now
        return self._acl

    # -- sessions -----------------------------------------------------------------------------------
    def sign_in(self, access_key: str, secret_key: str) -> Session:
        """A new session once every master accepts the keys; AUTHENTICATION_FAILED otherwise."""
        try:
            admin = self._make_admin(access_key, secret_key)
        except ValueError:  # a malformed key: say so without echoing what was typed
            raise SparkMQError(ErrorCode.AUTHENTICATION_FAILED,
                               "sign-in refused: the access key or secret key is malformed") from None
        try:
            answers = admin.whoami()
        except SparkMQError as exc:
            admin.close()
            if exc.code is ErrorCode.AUTHENTICATION_FAILED:
                raise SparkMQError(exc.code, f"sign-in refused: {exc.message}") from None
            raise
        except BaseException:
            admin.close()
            raise
        first = next(iter(answers.values()), {})
        entries = list(first.get("entries") or [])
        super_user = bool(first.get("super_user")) and all(a.get("super_user") for a in answers.values())
        try:
            policy = Policy(access_key, tuple(PolicyEntry.from_dict(e) for e in entries))
            table = AclTable(users={access_key: User(access_key, secret_key, super_user)},
                             policies={access_key: policy})
            peer = ipaddress.ip_address(first["peer_ip"]) if first.get("peer_ip") else None
        except ValueError as exc:  # a policy this console cannot read: show nothing as allowed, the brokers decide
            log.warning("the policy of %s does not parse here: %s", access_key, exc)
            table, peer = AclTable(users={access_key: User(access_key, secret_key, super_user)}), None
        session = Session(secrets.token_urlsafe(32), access_key, super_user, entries, admin, table, peer)
        with self._lock:
            self._expire_locked()
            self._sessions[session.sid] = session
        log.info("console sign-in: user=%s super_user=%s", access_key, super_user)
        return session

    def get(self, sid: str | None) -> Session | None:
        """The live session of ``sid`` (its idle clock restarted), None when unknown or expired."""
        if not sid:
            return None
        with self._lock:
            session = self._sessions.get(sid)
            if session is None or time.monotonic() - session.last_used > self._idle_s:
                if session is not None:
                    self._drop_locked(sid)
                return None
            session.last_used = time.monotonic()
            return session

    def sign_out(self, sid: str | None) -> bool:
        """Forget a session and close its client; whether there was one."""
        with self._lock:
            return self._drop_locked(sid) if sid else False

    def close(self) -> None:
        """Forget every session."""
        with self._lock:
            for sid in list(self._sessions):
                self._drop_locked(sid)

    def _expire_locked(self) -> None:
        now = time.monotonic()
        for sid, s in list(self._sessions.items()):
            if now - s.last_used > self._idle_s:
                self._drop_locked(sid)

    def _drop_locked(self, sid: str) -> bool:
        session = self._sessions.pop(sid, None)
        if session is None:
            return False
        if self._on_drop is not None:
            self._on_drop(session.admin)
        session.admin.close()
        return True
