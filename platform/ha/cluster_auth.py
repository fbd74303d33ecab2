"""The cluster credential: brokers prove to each other that they know the cluster's shared secret.

Every connection between brokers -- a slave's HA stream to its master, a DLedger member's Raft
connection to a peer -- starts with a proof over a fresh nonce and the time::

    proof = timestamp ms i64 (little-endian) | nonce (16 random bytes) | mac (32 bytes)
    mac   = mac_of(cluster_secret, "CLUSTER-" PURPOSE, IDENTITY, TIMESTAMP, nonce, parts)  # platform/auth/signing.py

with the one part what the connection is about (the HELLO's bytes).  The answering side
checks the timestamp against the clock-skew window, the mac (constant time), and that it has not
seen the nonce within the window, so a captured handshake cannot be replayed, later or sooner.  It
answers with a mac of its own over the same nonce (purpose ``...-ANSWER``): the connecting side
learns that it reached a broker of its cluster, not an impostor at the address.

The secret is the ``[broker]`` key ``cluster_secret`` (give every broker of the cluster the same
one); it is never logged or shown.  With ``acl_enabled`` (or a secret set) a broker requires the
proof: a connection without it, or with a wrong one, is refused -- one warning and one
``sparkmq.audit`` line per peer address and reason, later ones only counted.
"""
from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import struct
import threading
import time
from collections.abc import Callable

from ..auth.guard import audit_log
from ..auth.model import validate_secret_key
from ..auth.signing import mac_of

__all__ = ["ClusterAuth", "PROOF", "NONCE_BYTES", "MAC_BYTES"]

log = logging.getLogger("sparkmq.ha")

NONCE_BYTES = 16
MAC_BYTES = 32
#: A handshake proof: timestamp ms, nonce, mac.
PROOF = struct.Struct(f"<q{NONCE_BYTES}s{MAC_BYTES}s")
#: Nonces remembered against replays (each for the skew window); beyond this the oldest are dropped.
_MAX_NONCES = 200_000


class ClusterAuth:
    """The cluster secret of one broker and the handshake checks made with it; thread-safe.

    ``required``: connections must prove the secret (ACL on, or a secret configured).  A broker that
    requires it but has no secret refuses every peer (and says so at start-up).

    Example::

        >>> a = ClusterAuth("a-long-cluster-secret", required=True)
        >>> proof = a.prove("HA", "broker-a/1", b"hello")
        >>> a.check("HA", "broker-a/1", proof, b"hello") is None
        True
        >>> a.check("HA", "broker-a/1", proof, b"hello")     # the same nonce again
        'replayed handshake (nonce seen before)'
    """

    def __init__(self, secret: str | None, *, required: bool, clock_skew_s: float = 300.0,
                 clock: Callable[[], float] = time.time) -> None:
        if secret is not None:
            validate_secret_key(secret)
        self._secret = secret.encode() if secret else None
        self.required = required
        self.clock_skew_ms = int(clock_skew_s * 1000)
        self._clock = clock
        self._lock = threading.Lock()
        self._nonces: dict[bytes, float] = {}
        self._logged: set[tuple[str, str, str]] = set()
        #: Refusals by reason (shown in the HA / DLedger status).
        self.refused: dict[str, int] = {}

    def __repr__(self) -> str:  # never the secret
        return f"ClusterAuth(secret={'set' if self._secret else 'unset'}, required={self.required})"

    @property
    def has_secret(self) -> bool:
        """Whether this broker knows a cluster secret (and so proves it when it connects)."""
        return self._secret is not None

    # -- the connecting side --------------------------------------------------------------------
    def prove(self, purpose: str, identity: str, context: bytes = b"") -> bytes:
        """A fresh :data:`PROOF` that this broker knows the secret, bound to ``identity`` and ``context``."""
        assert self._secret is not None, "no cluster secret to prove"
        ts = int(self._clock() * 1000)
        nonce = os.urandom(NONCE_BYTES)
        return PROOF.pack(ts, nonce, self._mac(purpose, identity, ts, nonce, context))

    def check_answer(self, purpose: str, identity: str, proof: bytes, answer: bytes, context: bytes = b"") -> bool:
        """Whether ``answer`` is the peer's mac over the nonce of ``proof`` (the peer knows the secret too)."""
        if self._secret is None or len(answer) != MAC_BYTES:
            return False
        ts, nonce, _ = PROOF.unpack(proof)
        return hmac.compare_digest(answer, self._mac(purpose + "-ANSWER", identity, ts, nonce, context))

    # -- the answering side ---------------------------------------------------------------------
    def check(self, purpose: str, identity: str, proof: bytes | None, context: bytes = b"") -> str | None:
        """None when ``proof`` is a valid, fresh, unseen proof; else why not (never naming the secret)."""
        if proof is None:
            return "no cluster credential (set cluster_secret on every broker of the cluster)"
        if self._secret is None:
            return "this broker has no cluster_secret to check the credential with"
        if len(proof) != PROOF.size:
            return "malformed cluster credential"
        ts, nonce, mac = PROOF.unpack(proof)
        now = self._clock()
        if abs(int(now * 1000) - ts) > self.clock_skew_ms:
            return f"cluster credential signed {abs(int(now * 1000) - ts) / 1000:.0f} s away from this clock"
        if not hmac.compare_digest(mac, self._mac(purpose, identity, ts, nonce, context)):
            return "wrong cluster secret"
        with self._lock:
            if nonce in self._nonces:
                return "replayed handshake (nonce seen before)"
            if len(self._nonces) >= _MAX_NONCES:
                self._nonces = {n: t for n, t in self._nonces.items() if t > now}
                while len(self._nonces) >= _MAX_NONCES:
                    self._nonces.pop(next(iter(self._nonces)))
            self._nonces[nonce] = now + 2 * self.clock_skew_ms / 1000  # past this the timestamp check refuses it
        return None

    def answer(self, purpose: str, identity: str, proof: bytes, context: bytes = b"") -> bytes:
        """The mac that proves this side knows the secret too (over the connecting side's nonce)."""
        assert self._secret is not None
        ts, nonce, _ = PROOF.unpack(proof)
        return self._mac(purpose + "-ANSWER", identity, ts, nonce, context)

    def note_refusal(self, where: str, peer: str | None, reason: str) -> None:
        """Count a refused connection; log it (and one audit line) the first time per peer address and reason."""
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1
            key = (where, _ip_of(peer), reason)
            if key in self._logged:
                return
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged.add(key)
        log.warning("%s: refused a connection from %s: %s (logged once per address; counted in the status)",
                    where, peer or "-", reason)
        audit_log.warning("denied user=cluster from=%s request=%s reason=%s", peer or "-", where, reason)

    def _mac(self, purpose: str, identity: str, ts: int, nonce: bytes, context: bytes) -> bytes:
        assert self._secret is not None
        return mac_of(self._secret, f"CLUSTER-{purpose}", identity, ts, nonce, (context,))


def _ip_of(peer: str | None) -> str:
    if not peer:
        return "-"
    host = peer.rsplit(":", 1)[0].strip("[]") if peer.count(":") == 1 or peer.startswith("[") else peer
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return peer
