"""QueryRoute and QueryAssignment answers, built from the name servers' routes.

A route names every broker's gRPC endpoint (``grpc_addrs`` in the name server's broker data), so a
client configured with any one broker reaches all of them.  Only master queues are listed (broker id 0):
sends and POP receives go to masters.
"""
from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx

from ...platform.auth.signing import Credentials
from ...platform.client.remoting import signing_auth
from ...platform.common.errors import ErrorCode, SparkMQError
from ...platform.common.limits import client_pool_limits
from ...platform.common.perm import is_readable, is_writeable
from ...platform.common.tls import TlsSettings
from ...platform.common.validation import validate_topic
from ._pb import definition
from .convert import ALL_MESSAGE_TYPES, endpoints_of, unwrap

__all__ = ["RouteResolver"]

log = logging.getLogger("sparkmq.broker.grpc")

#: How long a fetched route is reused (clients ask every 30 s; tests create topics and ask at once).
_ROUTE_TTL_S = 1.0
_MASTER = "0"


def _permission(readable: bool, writeable: bool) -> int:
    if readable and writeable:
        return definition.Permission.READ_WRITE
    if readable:
        return definition.Permission.READ
    return definition.Permission.WRITE if writeable else definition.Permission.NONE


class RouteResolver:
    """Topic routes from the name servers (the first that answers), as v2 message queues."""

    def __init__(self, namesrv_addrs: Sequence[str], timeout_s: float = 3.0, tls: TlsSettings | None = None,
                 credentials: Credentials | None = None) -> None:
        """``tls``: the name servers are called over HTTPS when ``tls.connects`` (verified against its CA);
        ``credentials`` sign every lookup (name servers with ACL on)."""
        self.namesrv_addrs = tuple(namesrv_addrs)
        tls = tls or TlsSettings()
        self._scheme = tls.scheme
        self._http = httpx.AsyncClient(timeout=timeout_s, verify=tls.http_verify(),
                                       auth=signing_auth(credentials), limits=client_pool_limits())
        self._cache: dict[str, tuple[float, dict[str, Any]]] = {}

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._http.aclose()

    async def _route(self, topic: str) -> dict[str, Any]:
        # A legal name only (TOPIC_ILLEGAL, not a URL that breaks or points elsewhere), escaped: % and | are legal.
        validate_topic(topic)
        cached = self._cache.get(topic)
        if cached is not None and time.monotonic() - cached[0] < _ROUTE_TTL_S:
            return cached[1]
        not_found = False
        for addr in self.namesrv_addrs:
            try:
                answer = await self._http.get(f"{self._scheme}://{addr}/routes/{quote(topic, safe='')}")
            except httpx.HTTPError as exc:
                log.debug("name server %s: %s", addr, exc)
                continue
            if answer.status_code == 404:
                not_found = True
                continue
            if answer.status_code == 200:
                route = answer.json()
                self._cache[topic] = (time.monotonic(), route)
                return route
        if not_found or not self.namesrv_addrs:
            raise SparkMQError(ErrorCode.TOPIC_NOT_EXIST, f"topic {topic!r} has no route")
        raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, "no name server answered")

    async def message_queues(self, topic: str, namespace: str) -> list[definition.MessageQueue]:
        """Every master queue of ``topic`` (a wrapped name) on a broker that serves gRPC.

        TOPIC_NOT_EXIST when no name server knows the topic or no broker of it serves gRPC.
        """
        route = await self._route(topic)
        brokers = {b["broker_name"]: b for b in route.get("broker_datas", ())}
        resource = definition.Resource(name=unwrap(namespace, topic), resource_namespace=namespace)
        per_broker: list[list[definition.MessageQueue]] = []
        for data in sorted(route.get("queue_datas", ()), key=lambda q: q["broker_name"]):
            broker = brokers.get(data["broker_name"], {})
            grpc_addr = (broker.get("grpc_addrs") or {}).get(_MASTER)
            if grpc_addr is None or _MASTER not in (broker.get("broker_addrs") or {}):
                continue
            endpoint = definition.Broker(name=data["broker_name"], id=0, endpoints=endpoints_of(grpc_addr))
            reads, writes, perm = data["read_queue_nums"], data["write_queue_nums"], data["perm"]
            queues: list[definition.MessageQueue] = []
            per_broker.append(queues)
            for queue_id in range(max(reads, writes)):
                permission = _permission(queue_id < reads and is_readable(perm),
                                         queue_id < writes and is_writeable(perm))
                if permission == definition.Permission.NONE:
                    continue
                queues.append(definition.MessageQueue(topic=resource, id=queue_id, permission=permission,
                                                      broker=endpoint, accept_message_types=ALL_MESSAGE_TYPES))
        # Brokers take turns (a0 b0 a1 b1 ...): clients walk the list round robin, so consecutive receives, and a
        # send's retry after a failure, go to the next broker rather than to another queue of the same one.
        interleaved = [q for turn in itertools.zip_longest(*per_broker) for q in turn if q is not None]
        if not interleaved:
            raise SparkMQError(ErrorCode.TOPIC_NOT_EXIST, f"no master broker of topic {topic!r} serves gRPC")
        return interleaved

    async def assignments(self, topic: str, namespace: str) -> list[definition.Assignment]:
        """One readable queue per broker (a POP receive there serves every queue of that broker)."""
        seen: set[str] = set()
        out = []
        for queue in await self.message_queues(topic, namespace):
            readable = queue.permission in (definition.Permission.READ, definition.Permission.READ_WRITE)
            if readable and queue.broker.name not in seen:
                seen.add(queue.broker.name)
                out.append(definition.Assignment(message_queue=queue))
        return out
