"""The ACL table as brokers copy it to each other: a master to its slaves (HA stream), a DLedger leader to its
followers (Raft connection).  Only ever sent over a connection authenticated with the cluster secret.

The table sent is the file's users and policies (:attr:`AclStore.stored`: never the config's bootstrap super
user); the receiver writes it to its own ``config/acl.json`` (atomically), where its access guard picks it up
within a second, and where it survives a restart.
"""
from __future__ import annotations

import json

from ..auth.model import AclTable
from ..auth.store import AclStore

__all__ = ["encode_acl", "apply_acl"]


def encode_acl(table: AclTable) -> bytes:
    """The wire form of ``table`` (the ACL file's JSON)."""
    return json.dumps(table.to_dict(), sort_keys=True).encode()


def apply_acl(store: AclStore, data: bytes) -> AclTable:
    """Make the table ``data`` encodes ``store``'s (unchanged when equal); ValueError when it does not parse."""
    try:
        table = AclTable.from_dict(json.loads(data))
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the ACL table does not parse: {exc}") from None
    store.maybe_reload()  # compare with the file as it is now (its guard may have written it)
    store.replace_all(table)
    return table
