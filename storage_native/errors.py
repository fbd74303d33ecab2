"""The one error type of the storage layer, shared by the C core and the Python twin.

Both implementations raise ``StoreError(code, message)`` with the same code and the
same message for the same fault, so callers (and the parity tests) can rely on them.
Wrong Python types raise ``TypeError`` as usual.
"""
from __future__ import annotations

__all__ = [
    "StoreError",
    "INVALID_ARGUMENT",
    "OFFSET_ILLEGAL",
    "OFFSET_TOO_SMALL",
    "OFFSET_OVERFLOW",
    "OFFSET_MISMATCH",
    "CORRUPT_RECORD",
    "CORRUPT_STORE",
    "DISK_FULL",
    "IO_ERROR",
    "CLOSED",
    "MESSAGE_ILLEGAL",
    "MESSAGE_TOO_LARGE",
    "PROPERTIES_TOO_LARGE",
]

#: An argument is out of range (sizes, ids, host length, segment size …).
INVALID_ARGUMENT = "INVALID_ARGUMENT"
#: An offset inside the log that is not the start of a record.
OFFSET_ILLEGAL = "OFFSET_ILLEGAL"
#: An offset below the oldest retained byte / unit.
OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
#: An offset at or past the end of what is written.
OFFSET_OVERFLOW = "OFFSET_OVERFLOW"
#: Replicated data that does not continue this log: it starts elsewhere than the log's
#: end, a record in it names another commit-log offset than its own, or a record's queue
#: offset is not the next one of its queue.  The slave and its master disagree: the slave
#: must report its max offset and fetch again from there.
OFFSET_MISMATCH = "OFFSET_MISMATCH"
#: A record whose magic, size or CRC does not check out.
CORRUPT_RECORD = "CORRUPT_RECORD"
#: The files of a store do not fit together (gaps, wrong sizes, bad names).
CORRUPT_STORE = "CORRUPT_STORE"
#: No space left to create or extend a file.
DISK_FULL = "DISK_FULL"
#: Any other operating-system error; the message carries errno's text.
IO_ERROR = "IO_ERROR"
#: The log was closed.
CLOSED = "CLOSED"
#: A message of a packed batch (or one being encoded) breaks a message rule:
#: framing, empty body, malformed properties, bad TAGS/KEYS/UNIQ_KEY, a reserved name.
MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
#: A body of a packed batch is larger than the broker's maximum message size.
MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
#: The properties of a packed-batch message are larger than the broker's limit.
PROPERTIES_TOO_LARGE = "PROPERTIES_TOO_LARGE"


class StoreError(Exception):
    """A storage fault with a stable ``code`` (one of the constants above)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"
