"""The ACL tests' users and settings, defined once (``tests/test_acl*.py``, the dev platform's ACL test).

Every ACL-enabled service of those tests has ``root`` as its bootstrap super user and a 60 s clock-skew
window (:data:`ACL_SETTINGS`); the other users are created per service by the tests that need them.
"""
from __future__ import annotations

from typing import Any

import httpx

from sparkmq.platform.auth import Credentials

__all__ = ["ROOT", "ALICE", "BOB", "CAROL", "WRONG", "STALE_MS", "ACL_SETTINGS", "ok"]

ROOT = Credentials("root", "root-secret-1")
ALICE = Credentials("alice", "alice-secret-1")
BOB = Credentials("bob", "bob-secret-1")
CAROL = Credentials("carol", "carol-secret-1")
#: Alice's access key with a secret that is not hers.
WRONG = Credentials("alice", "not-her-secret")
#: The ``acl_*`` settings of a service (``[broker]``, ``[namesrv]``, ``[gateway]``) with ACL on.
ACL_SETTINGS: dict[str, Any] = {"acl_enabled": True, "acl_super_user_access_key": ROOT.access_key,
                                "acl_super_user_secret_key": ROOT.secret_key, "acl_clock_skew_s": 60.0}
#: Further from now than the window of :data:`ACL_SETTINGS`: a replayed request.
STALE_MS = 120_000


def ok(resp: httpx.Response) -> Any:
    """The JSON of a 200 answer (an assertion naming the answer otherwise)."""
    assert resp.status_code == 200, resp.text
    return resp.json()
