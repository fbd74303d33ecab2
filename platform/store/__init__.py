"""The store: MessageStore over the native commit log (put, get, flush, recover, retain, verify)."""
from .config import FlushMode, StoreConfig
from .message_store import MessageStore
from .status import (
    AppendEvent,
    AppendGate,
    AppendNote,
    GetResult,
    GetStatus,
    LogOffsets,
    PackedGetResult,
    PackedPutResult,
    PutResult,
    PutStatus,
)
from .verify import VerifyReport, verify_store

__all__ = [
    "FlushMode",
    "StoreConfig",
    "MessageStore",
    "AppendEvent",
    "AppendGate",
    "AppendNote",
    "LogOffsets",
    "PackedGetResult",
    "PackedPutResult",
    "GetResult",
    "GetStatus",
    "PutResult",
    "PutStatus",
    "VerifyReport",
    "verify_store",
]
