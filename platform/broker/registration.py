"""Registration with the name servers (RocketMQ's ``registerBrokerAll``).

The broker registers with *every* name server every ``register_interval_s`` (30 s),
at once on start, and at once whenever its topic table changes (:meth:`trigger`); the
body carries the whole topic table and its ``data_version``.  On shutdown it
unregisters from all of them so its routes disappear without waiting for expiry.

Each name server has its own thread and HTTP client, so an unreachable or slow name
server only delays itself.  Outcomes per name server are kept for ``/health``.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from ..auth.signing import Credentials
from ..client.remoting import signing_auth
from ..common.failure_log import FailureLog
from ..common.limits import client_pool_limits
from ..common.tls import TlsSettings

__all__ = ["RegistrationService", "NameServerStatus"]

log = logging.getLogger("sparkmq.broker")

#: Builds the registration body (called for each attempt, so it always carries the current table).
PayloadFn = Callable[[], Mapping[str, Any]]
#: Takes a name server's answer to a registration (``changed``, ``master_addr``, ``master_ha_addr``).
AnswerFn = Callable[[dict[str, Any]], None]


@dataclass
class NameServerStatus:
    """How registering with one name server went most recently."""

    addr: str
    ok: bool = False
    registrations: int = 0
    failures: int = 0
    last_success_ms: int | None = None
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (for ``/health``)."""
        return {"ok": self.ok, "registrations": self.registrations, "failures": self.failures,
                "last_success_ms": self.last_success_ms, "last_error": self.last_error}


class _Worker:
    """One name server: a thread that registers on every interval or trigger."""

    def __init__(self, addr: str, payload: PayloadFn, interval_s: float, timeout_s: float,
                 on_answer: AnswerFn | None = None, tls: TlsSettings | None = None,
                 credentials: Credentials | None = None) -> None:
        self.addr = addr
        self._on_answer = on_answer
        self.status = NameServerStatus(addr)
        # A name server that is down fails every round: the first failure in full, then a summary a minute.
        self._failures = FailureLog(log, f"registering with name server {addr}")
        self._payload = payload
        self._interval_s = interval_s
        tls = tls or TlsSettings()
        # Signed: a name server with ACL on needs Update on Cluster for registrations (docs/security.md).
        self._client = httpx.Client(base_url=f"{tls.scheme}://{addr}", timeout=timeout_s,
                                    verify=tls.http_verify(),
                                    auth=signing_auth(credentials), limits=client_pool_limits())
        self._wake = threading.Event()
        self._stop = threading.Event()
        #: Set once the first registration attempt has ended, however it went.
        self.first_round = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sparkmq-register-{addr}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def trigger(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def close(self) -> None:
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before registering: a trigger during the call causes one more round
            self.register()
            self.first_round.set()
            self._wake.wait(self._interval_s)

    def register(self) -> bool:
        try:
            body = dict(self._payload())
            response = self._client.post("/brokers/register", json=body)
            response.raise_for_status()
            if self._on_answer is not None:
                self._on_answer(response.json())
        except Exception as exc:  # any failure (refused, timeout, 4xx/5xx) is retried next round
            self.status.ok = False
            self.status.failures += 1
            message = f"{type(exc).__name__}: {exc}"
            self._failures.failure("%s", message)
            self.status.last_error = message
            return False
        self._failures.success()
        self.status.ok = True
        self.status.registrations += 1
        self.status.last_success_ms = time.time_ns() // 1_000_000
        self.status.last_error = None
        return True

    def unregister(self, body: Mapping[str, Any]) -> bool:
        try:
            self._client.post("/brokers/unregister", json=dict(body)).raise_for_status()
            return True
        except Exception as exc:  # it will expire the broker on its own
            log.warning("unregistering from name server %s failed: %s: %s", self.addr, type(exc).__name__, exc)
            return False
        finally:
            self._client.close()


class RegistrationService:
    """Registers a broker with every name server periodically and on demand."""

    def __init__(self, namesrv_addrs: tuple[str, ...] | list[str], payload: PayloadFn, unregister_body: PayloadFn,
                 interval_s: float = 30.0, timeout_s: float = 3.0, on_answer: AnswerFn | None = None,
                 tls: TlsSettings | None = None, credentials: Credentials | None = None) -> None:
        """``payload()`` builds the ``POST /brokers/register`` body, ``unregister_body()`` the unregister one;
        ``on_answer(json)`` gets each successful answer (a slave learns its master from it).  With
        ``tls.connects`` the name servers are called over HTTPS, verified against ``tls.ca_file``; with
        ``credentials`` every call is signed (name servers with ACL on)."""
        self._workers = [_Worker(a, payload, interval_s, timeout_s, on_answer, tls, credentials)
                         for a in namesrv_addrs]
        self._unregister_body = unregister_body
        self._timeout_s = timeout_s
        self._started = False

    def start(self) -> RegistrationService:
        """Start one thread per name server; each registers at once."""
        if not self._started:
            self._started = True
            for worker in self._workers:
                worker.start()
        return self

    def wait_first_round(self, timeout_s: float | None = None) -> bool:
        """Wait until the first registration attempt with every name server has ended (at most ``timeout_s``,
        by default one request's timeout and a second); whether all ended.

        A broker announces itself ready only after this, as RocketMQ's does after its first registration: a
        client or an admin tool that asks the name servers right away then finds it (if they answered)."""
        if not self._started:
            return False
        deadline = time.monotonic() + (self._timeout_s + 1 if timeout_s is None else timeout_s)
        return all(worker.first_round.wait(max(0.0, deadline - time.monotonic())) for worker in self._workers)

    def trigger(self) -> None:
        """Register with every name server now (the topic table changed)."""
        for worker in self._workers:
            worker.trigger()

    def status(self) -> dict[str, NameServerStatus]:
        """Per name server: how the latest registration went."""
        return {w.addr: w.status for w in self._workers}

    @property
    def healthy(self) -> bool:
        """Whether the latest registration succeeded with every name server (True when there are none)."""
        return all(w.status.ok for w in self._workers)

    def stop(self, unregister: bool = True) -> dict[str, bool]:
        """Stop the threads, then unregister from every name server in parallel; returns success by address."""
        for worker in self._workers:
            worker.stop()
        if self._started:  # a broker that failed to start never started its workers
            for worker in self._workers:
                worker.join(self._timeout_s + 1)
        results: dict[str, bool] = {}
        if not self._started:
            for worker in self._workers:
                worker.close()
            return results
        self._started = False
        if not unregister:
            return results
        body = self._unregister_body()
        threads = []
        for worker in self._workers:
            t = threading.Thread(target=lambda w=worker: results.__setitem__(w.addr, w.unregister(body)),
                                 name=f"sparkmq-unregister-{worker.addr}", daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(self._timeout_s + 1)
        return results
