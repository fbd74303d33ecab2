"""One processor per request family (RocketMQ's broker/processor): each takes typed requests and
returns typed results over the broker's components; protocol adapters only decode, call and encode."""
from .admin import AdminProcessor
from .base import Processor
from .consumer import ConsumerProcessor
from .pull import PullProcessor
from .query import QueryProcessor
from .send import BatchSendResult, OutgoingMessage, PackedSendResult, SendProcessor
from .transaction import TransactionProcessor

__all__ = [
    "Processor",
    "SendProcessor",
    "PullProcessor",
    "ConsumerProcessor",
    "AdminProcessor",
    "TransactionProcessor",
    "QueryProcessor",
    "OutgoingMessage",
    "BatchSendResult",
    "PackedSendResult",
]
