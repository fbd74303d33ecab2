"""The Python client: producers, consumers, allocation strategies, admin.

Everything a user needs is importable from here::

    from sparkmq.platform.client import ClientConfig, Producer, PushConsumer, ConsumeStatus, Message
"""
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
