"""Which brokers speak remoting, and where: learnt from the name servers' routes.

A broker's HTTP address is its identity in routes; its remoting endpoint is a fact about that broker,
shared by every client of the process (producers, consumers and the pools they use).
"""
from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["learn_remoting_endpoints", "remoting_endpoint"]

_lock = threading.Lock()
#: A broker's HTTP address -> its remoting endpoint.
_endpoints: dict[str, str] = {}


def learn_remoting_endpoints(addrs_by_id: Mapping[int, str], remoting_by_id: Mapping[Any, Any]) -> None:
    """Remember each broker id's remoting endpoint (``remoting_addrs`` of a route's broker data)."""
    with _lock:
        for broker_id, endpoint in remoting_by_id.items():
            addr = addrs_by_id.get(int(broker_id))
            if addr is not None and isinstance(endpoint, str) and endpoint:
                _endpoints[addr] = endpoint


def remoting_endpoint(addr: str) -> str | None:
    """The remoting endpoint of the broker at HTTP address ``addr``, when a route named one."""
    return _endpoints.get(addr)
