"""Bits of a stored record's ``sys_flag`` (RocketMQ's ``MessageSysFlag``, same values).

The producer sets COMPRESSED when it zlib-compressed the body; consumers inflate it.
The transaction bits (issue 4) say whether a record is a half (PREPARED) message or
an op record's outcome.
"""
from __future__ import annotations

__all__ = [
    "COMPRESSED",
    "MULTI_TAGS",
    "TRANSACTION_MASK",
    "TRANSACTION_NOT_TYPE",
    "TRANSACTION_PREPARED",
    "TRANSACTION_COMMIT",
    "TRANSACTION_ROLLBACK",
]

COMPRESSED = 0x1
MULTI_TAGS = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC
TRANSACTION_MASK = 0xC
