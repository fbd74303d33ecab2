"""The Python client: producers, consumers, allocation strategies, admin.

Everything a user needs is importable from here::

    from sparkmq.platform.client import ClientConfig, Producer, PushConsumer, ConsumeStatus, Message
"""
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers; at run time each is imported on first use (below)
    from ..common.message import Message
    from ..common.wire import ReceivedMessage
    from .admin import AdminClient, GroupLag, QueueLag, QueueStats
    from .aio import AsyncConsumer, AsyncProducer
    from .allocation import (
        DEFAULT_STRATEGY,
        STRATEGIES,
        AllocateAveragely,
        AllocateAveragelyByCircle,
        AllocateConsistentHash,
        AllocateStrategy,
        MessageQueue,
        strategy_by_name,
    )
    from .config import ClientConfig, default_client_id
    from .fault import LatencyFaultTolerance, QueueSelector, not_available_duration_ms
    from .offset_store import LocalOffsetStore, OffsetStore, ReadOffsetType, RemoteOffsetStore
    from .process_queue import ProcessQueue
    from .producer import Producer, QueueSelectorFn, SendCallback, SendResult, SendStatus, select_by_sharding_key
    from .pull_consumer import PullConsumer
    from .push_consumer import (
        DEFAULT_MAX_RECONSUME_TIMES,
        ConsumeOrderlyStatus,
        ConsumeStatus,
        MessageListener,
        OrderlyMessageListener,
        PushConsumer,
    )
    from .rebalance import ConsumeFromWhere, MessageModel, MessageSelector, Subscription
    from .remoting import BrokerClient, NameServerClient, PullResult, RemotingError
    from .routes import TopicRouteCache, TopicRouteInfo
    from .transaction_producer import (
        TransactionCheck,
        TransactionProducer,
        TransactionSendResult,
        TransactionState,
    )

#: Where each public name lives.  The package imports a submodule when one of its names is first used
#: (PEP 562): a process that needs one piece -- a Spark Python worker importing the ``sparkmq`` source, which
#: wants the queue type and the remoting client -- does not pay for the admin client, asyncio client and
#: consumers (a third of a second per process, and Spark starts such processes often).
_EXPORTS: dict[str, str] = {
    "Message": "..common.message",
    "ReceivedMessage": "..common.wire",
    "AdminClient": ".admin",
    "GroupLag": ".admin",
    "QueueLag": ".admin",
    "QueueStats": ".admin",
    "AsyncConsumer": ".aio",
    "AsyncProducer": ".aio",
    "DEFAULT_STRATEGY": ".allocation",
    "STRATEGIES": ".allocation",
    "AllocateAveragely": ".allocation",
    "AllocateAveragelyByCircle": ".allocation",
    "AllocateConsistentHash": ".allocation",
    "AllocateStrategy": ".allocation",
    "MessageQueue": ".allocation",
    "strategy_by_name": ".allocation",
    "ClientConfig": ".config",
    "default_client_id": ".config",
    "LatencyFaultTolerance": ".fault",
    "QueueSelector": ".fault",
    "not_available_duration_ms": ".fault",
    "LocalOffsetStore": ".offset_store",
    "OffsetStore": ".offset_store",
    "ReadOffsetType": ".offset_store",
    "RemoteOffsetStore": ".offset_store",
    "ProcessQueue": ".process_queue",
    "Producer": ".producer",
    "QueueSelectorFn": ".producer",
    "SendCallback": ".producer",
    "SendResult": ".producer",
    "SendStatus": ".producer",
    "select_by_sharding_key": ".producer",
    "PullConsumer": ".pull_consumer",
    "DEFAULT_MAX_RECONSUME_TIMES": ".push_consumer",
    "ConsumeOrderlyStatus": ".push_consumer",
    "ConsumeStatus": ".push_consumer",
    "MessageListener": ".push_consumer",
    "OrderlyMessageListener": ".push_consumer",
    "PushConsumer": ".push_consumer",
    "ConsumeFromWhere": ".rebalance",
    "MessageModel": ".rebalance",
    "MessageSelector": ".rebalance",
    "Subscription": ".rebalance",
    "BrokerClient": ".remoting",
    "NameServerClient": ".remoting",
    "PullResult": ".remoting",
    "RemotingError": ".remoting",
    "TopicRouteCache": ".routes",
    "TopicRouteInfo": ".routes",
    "TransactionCheck": ".transaction_producer",
    "TransactionProducer": ".transaction_producer",
    "TransactionSendResult": ".transaction_producer",
    "TransactionState": ".transaction_producer",
}


def __getattr__(name: str) -> Any:
    """A public name of the package, imported from its submodule on first use (``AttributeError`` otherwise)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    """The package's names, those not imported yet included."""
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "AdminClient",
    "AllocateAveragely",
    "AllocateAveragelyByCircle",
    "AllocateConsistentHash",
    "AllocateStrategy",
    "AsyncConsumer",
    "AsyncProducer",
    "BrokerClient",
    "ClientConfig",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "DEFAULT_MAX_RECONSUME_TIMES",
    "DEFAULT_STRATEGY",
    "GroupLag",
    "LatencyFaultTolerance",
    "LocalOffsetStore",
    "Message",
    "MessageListener",
    "MessageModel",
    "MessageQueue",
    "MessageSelector",
    "NameServerClient",
    "OffsetStore",
    "OrderlyMessageListener",
    "ProcessQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "QueueLag",
    "QueueSelector",
    "QueueSelectorFn",
    "QueueStats",
    "ReadOffsetType",
    "ReceivedMessage",
    "RemoteOffsetStore",
    "RemotingError",
    "STRATEGIES",
    "SendCallback",
    "SendResult",
    "SendStatus",
    "Subscription",
    "TopicRouteCache",
    "TopicRouteInfo",
    "TransactionCheck",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionState",
    "default_client_id",
    "not_available_duration_ms",
    "select_by_sharding_key",
    "strategy_by_name",
]
