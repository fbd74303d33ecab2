"""The durable ACL store: users and policies in one JSON file under a service's data dir.

The file (``<data_dir>/config/acl.json``, see :func:`acl_path`) is replaced atomically on every change
(temporary file, fsync, rename, directory fsync): after a crash it holds the old table or the new one.
Changes made by another process (a slave copying its master's file, an operator's edit) are picked up by
:meth:`AclStore.maybe_reload`, which looks at the file's identity at most every ``reload_interval_s``;
a file that does not parse is logged and the last good table kept.

A bootstrap super user from the service's config (``acl_super_user_access_key`` / ``..._secret_key``) is
part of every table but never written to the file: the config stays its one source.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from ..common.durable_file import replace_durably
from ..common.errors import ErrorCode, SparkMQError
from .model import AclTable, Policy, PolicyEntry, ResourcePattern, User

__all__ = ["AclStore", "acl_path", "ACL_FILE"]

log = logging.getLogger("sparkmq.auth")

#: The file name under ``<data_dir>/config``.
ACL_FILE = "acl.json"


def acl_path(data_dir: Path | str) -> Path:
    """Where a service with ``data_dir`` keeps its ACL."""
    return Path(data_dir) / "config" / ACL_FILE


def _invalid(message: str) -> SparkMQError:
    return SparkMQError(ErrorCode.INVALID_ARGUMENT, message)


class AclStore:
    """Users and policies, persisted in ``path``; thread-safe.

    Example::

        store = AclStore(acl_path("var/broker"))
        store.create_user(User("alice", "s3cret-key"))
        store.put_policy("alice", [PolicyEntry.from_dict({"resource": "Topic:orders-*", "actions": "Pub"})])
        store.table.decide("alice", Action.PUB, Resource.topic("orders-eu"), None)   # Decision.ALLOW
    """

    def __init__(self, path: Path, *, bootstrap: User | None = None, reload_interval_s: float = 1.0) -> None:
        """Load ``path`` (an absent file is an empty table); STORE_CORRUPT when it does not parse."""
        self.path = Path(path)
        self._bootstrap = bootstrap
        self._reload_interval_s = reload_interval_s
        self._lock = threading.RLock()
        self._listeners: list[Callable[[AclTable], None]] = []
        self._stored = AclTable()
        self._identity: tuple[int, int, int] | None = None
        self._next_check = 0.0
        try:
            self._load()
        except ValueError as exc:
            raise SparkMQError(ErrorCode.STORE_CORRUPT, f"{self.path}: {exc}") from None
        self.table = self._with_bootstrap(self._stored)

    # -- reading ---------------------------------------------------------------------------------
    def _file_identity(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _load(self) -> None:
        identity = self._file_identity()
        if identity is None:
            self._stored, self._identity = AclTable(), None
            return
        data = json.loads(self.path.read_text("utf-8"))
        self._stored = AclTable.from_dict(data)
        self._identity = identity

    def _with_bootstrap(self, stored: AclTable) -> AclTable:
        if self._bootstrap is None:
            return stored
        users = dict(stored.users)
        users[self._bootstrap.access_key] = self._bootstrap
        return replace(stored, users=users)

    def maybe_reload(self) -> bool:
        """Re-read the file when another process changed it (checked at most every ``reload_interval_s``);
        whether the table changed."""
        now = time.monotonic()
        if now < self._next_check:
            return False
        with self._lock:
            self._next_check = now + self._reload_interval_s
            if self._file_identity() == self._identity:
                return False
            before = self._stored
            try:
                self._load()
            except (ValueError, OSError) as exc:
                log.error("ACL file %s is unreadable; keeping the last good table: %s", self.path, exc)
                return False
            self._publish()
            log.info("ACL file %s reloaded (version %d -> %d)", self.path, before.version, self._stored.version)
            return True

    @property
    def stored(self) -> AclTable:
        """The file's users and policies, without the config's bootstrap super user (what a master sends its
        slaves; a new object after every change)."""
        return self._stored

    def add_listener(self, listener: Callable[[AclTable], None]) -> None:
        """Call ``listener(table)`` after every change (in this process or reloaded from the file)."""
        self._listeners.append(listener)

    def _publish(self) -> None:
        self.table = self._with_bootstrap(self._stored)
        for listener in self._listeners:
            listener(self.table)

    # -- writing ---------------------------------------------------------------------------------
    def _commit(self, stored: AclTable) -> None:
        """Persist ``stored`` (version + 1) atomically, then make it the table.  Caller holds the lock."""
        stored = replace(stored, version=self._stored.version + 1)
        data = json.dumps(stored.to_dict(), indent=2, sort_keys=True).encode()
        replace_durably(self.path, data, mode=0o600)  # secrets inside: owner only
        self._stored = stored
        self._identity = self._file_identity()
        self._publish()

    def create_user(self, user: User, *, replace_existing: bool = False) -> User:
        """Add ``user`` (INVALID_ARGUMENT when it exists, unless ``replace_existing``: then its secret and flag
        change)."""
        with self._lock:
            self._refuse_bootstrap(user.access_key)
            if user.access_key in self._stored.users and not replace_existing:
                raise _invalid(f"user {user.access_key!r} exists (update it instead)")
            users = dict(self._stored.users)
            users[user.access_key] = user
            self._commit(replace(self._stored, users=users))
            return user

    def delete_user(self, access_key: str) -> bool:
        """Remove a user and its policy; whether it existed."""
        with self._lock:
            self._refuse_bootstrap(access_key)
            if access_key not in self._stored.users:
                return False
            users = {k: v for k, v in self._stored.users.items() if k != access_key}
            policies = {k: v for k, v in self._stored.policies.items() if k != access_key}
            self._commit(replace(self._stored, users=users, policies=policies))
            return True

    def put_policy(self, subject: str, entries: Iterable[PolicyEntry]) -> Policy:
        """Add entries to ``subject``'s policy; an entry for a resource it already names replaces that one.
        INVALID_ARGUMENT when the subject is not a user."""
        with self._lock:
            if subject not in self._stored.users:
                raise _invalid(f"no user {subject!r}: create the user first")
            new = list(entries)
            if not new:
                raise _invalid("a policy needs at least one entry")
            old = self._stored.policies.get(subject)
            replaced = {str(e.resource) for e in new}
            kept = [e for e in (old.entries if old else ()) if str(e.resource) not in replaced]
            policy = Policy(subject, tuple(kept + new))
            policies = dict(self._stored.policies)
            policies[subject] = policy
            self._commit(replace(self._stored, policies=policies))
            return policy

    def delete_policy(self, subject: str, resource: str | None = None) -> int:
        """Remove ``subject``'s entry for ``resource`` (every entry when None); how many were removed."""
        with self._lock:
            old = self._stored.policies.get(subject)
            if old is None:
                return 0
            pattern = None if resource is None else str(ResourcePattern.parse(resource))
            kept = tuple(e for e in old.entries if pattern is not None and str(e.resource) != pattern)
            removed = len(old.entries) - len(kept)
            if not removed:
                return 0
            policies = dict(self._stored.policies)
            if kept:
                policies[subject] = Policy(subject, kept)
            else:
                del policies[subject]
            self._commit(replace(self._stored, policies=policies))
            return removed

    def replace_all(self, table: AclTable) -> None:
        """Make ``table`` the stored one (a slave copying its master's users and policies)."""
        with self._lock:
            if replace(table, version=0).to_dict() == replace(self._stored, version=0).to_dict():
                return
            self._commit(table)

    def _refuse_bootstrap(self, access_key: str) -> None:
        if self._bootstrap is not None and access_key == self._bootstrap.access_key:
            raise _invalid(f"user {access_key!r} is the bootstrap super user of the config file: change it there")
