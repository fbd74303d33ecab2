"""The name server: broker registration, expiry and topic routes (RocketMQ's namesrv).

Name servers are independent: each keeps its own :class:`RouteTable`, fed by brokers
that register with every name server; they never talk to each other. The HTTP face is
``sparkmq.api.namesrv_app`` (nothing here imports FastAPI).
"""
from __future__ import annotations

from ..common.perm import (
    PERM_INHERIT,
    PERM_READ,
    PERM_READ_WRITE,
    PERM_WRITE,
    is_readable,
    is_writeable,
    perm_to_string,
)
from .config import NameServerConfig
from .kv_config import KVConfigStore, kv_config_path
from .route_table import (
    MASTER_ID,
    BrokerData,
    BrokerIdentity,
    BrokerLiveInfo,
    ClusterInfo,
    QueueData,
    RouteTable,
    TopicConfig,
    TopicRoute,
)

__all__ = [
    "NameServerConfig",
    "KVConfigStore",
    "kv_config_path",
    "RouteTable",
    "TopicConfig",
    "QueueData",
    "BrokerData",
    "BrokerIdentity",
    "BrokerLiveInfo",
    "ClusterInfo",
    "TopicRoute",
    "MASTER_ID",
    "PERM_READ",
    "PERM_WRITE",
    "PERM_INHERIT",
    "PERM_READ_WRITE",
    "is_readable",
    "is_writeable",
    "perm_to_string",
]
