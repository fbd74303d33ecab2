"""Authentication and access control (RocketMQ 5 ACL 2.0 model) for every sparkmq entry point.

* :mod:`.model` -- users, resources (``Topic:name``, ``Group:name``, ``Cluster``, ``*`` and prefixes),
  actions, policies and the decision (deny wins, nothing matching denies, super users may do anything);
* :mod:`.store` -- the durable JSON store (atomic writes, reloaded when the file changes);
* :mod:`.signing` -- the HMAC-SHA256 request signature of sparkmq's HTTP and remoting requests, and the
  verifier of the official gRPC clients' ``MQv2-HMAC-SHA1`` header;
* :mod:`.guard` -- :class:`AccessGuard`: authenticate, authorize, audit (logger ``sparkmq.audit``).

``docs/security.md`` says how to turn it on.
"""
from __future__ import annotations

from .guard import DEFAULT_CLOCK_SKEW_S, AccessGuard, Need, Principal, audit_log, peer_ip
from .model import (
    ADMIN_ACTIONS,
    CLUSTER,
    AclTable,
    Action,
    Decision,
    Policy,
    PolicyEntry,
    Resource,
    ResourcePattern,
    ResourceType,
    User,
    parse_actions,
)
from .signing import Credentials, Signer
from .store import AclStore, acl_path

__all__ = ["AccessGuard", "AclStore", "AclTable", "Action", "ADMIN_ACTIONS", "CLUSTER", "Credentials",
           "DEFAULT_CLOCK_SKEW_S", "Decision", "Need", "Policy", "PolicyEntry", "Principal", "Resource",
           "ResourcePattern", "ResourceType", "Signer", "User", "acl_path", "audit_log", "parse_actions", "peer_ip"]
