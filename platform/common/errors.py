"""Stable error codes of sparkmq, each mapped once to a remoting number and an HTTP status.

Every API answers bad input with one of these codes; the hot path returns status
values instead (see ``platform.store.status``), and the processor layer turns both
into responses.  Codes are part of the public contract: never rename one.
"""
from __future__ import annotations

from enum import Enum

__all__ = ["ErrorCode", "SparkMQError"]


class ErrorCode(Enum):
    """(remoting number, HTTP status, one-line meaning) of every stable error code.

    The remoting number is the status of an error response frame (``docs/remoting.md``);
    numbers are unique (so no two codes can alias) and never reused.
    """

    INVALID_ARGUMENT = (1, 400, "a parameter is missing, of the wrong type or out of range")
    TOPIC_ILLEGAL = (2, 400, "the topic name is empty, too long or has characters outside [%|a-zA-Z0-9_-]")
    GROUP_ILLEGAL = (3, 400, "the group name is empty, too long or has characters outside [%|a-zA-Z0-9_-]")
    MESSAGE_ILLEGAL = (4, 400, "the message is malformed (empty body, bad property names or values, bad tag)")
    MESSAGE_TOO_LARGE = (5, 413, "the message body exceeds the maximum message size")
    PROPERTIES_TOO_LARGE = (6, 413, "the encoded message properties exceed the limit")
    QUEUE_ID_ILLEGAL = (7, 400, "the queue id is negative or not below the topic's queue count")
    OFFSET_ILLEGAL = (8, 400, "the offset is negative, not an integer, or not the start of a message")
    MESSAGE_ID_ILLEGAL = (9, 400, "the message id cannot be decoded")
    TOPIC_NOT_EXIST = (10, 404, "the topic does not exist")
    MESSAGE_NOT_FOUND = (11, 404, "no message at that id or offset")
    NO_PERMISSION = (12, 403, "the topic's perm forbids this operation, or the ACL does not allow the caller "
                              "this action on this resource from this address")
    STORE_LOCKED = (13, 409, "another process has the store open")
    SERVICE_NOT_AVAILABLE = (14, 503, "the service is starting, stopping or read-only")
    SLAVE_NOT_AVAILABLE = (15, 503, "no in-sync slave is available for a SYNC_MASTER write")
    FLUSH_DISK_TIMEOUT = (16, 504, "the message was stored but not flushed within the timeout")
    DISK_FULL = (17, 507, "the disk has no room for the store")
    STORE_CORRUPT = (18, 500, "the store's files are damaged")
    INTERNAL_ERROR = (19, 500, "an unexpected failure")
    FILTER_EXPRESSION_ILLEGAL = (20, 400, "a tag or SQL92 filter expression does not parse; the message says where")
    TRANSACTION_NOT_FOUND = (21, 404, "no pending half message has that transaction id (settled, discarded or unknown)")
    GROUP_NOT_EXIST = (22, 404, "the consumer group has no members and no committed offsets on this broker")
    REQUEST_CODE_NOT_SUPPORTED = (23, 400, "the remoting request code is unknown to this server")
    LAKE_NOT_AVAILABLE = (24, 503, "the answer needs the lake (the key index), and this broker runs none")
    STALE_EPOCH = (25, 409, "a DLedger leader of an older term tried to register as master over a newer one")
    DLEDGER_NOT_ENABLED = (26, 404, "the broker is not a member of a DLedger group (dledger_enabled is off)")
    LEADERSHIP_TRANSFER_FAILED = (27, 409, "a DLedger leadership transfer did not complete in time "
                                           "(target behind or unreachable, it did not win, or the lead was lost)")
    INVALID_RECEIPT_HANDLE = (28, 400, "the POP receipt handle is malformed, of another group or topic, stale "
                                       "(acked, redelivered or renewed since) or past its invisible time")
    INVISIBLE_TIME_ILLEGAL = (29, 400, "a POP invisible time is outside the allowed range")
    AUTHENTICATION_FAILED = (30, 401, "the request carries no credentials, an unknown access key, a bad signature, "
                                      "or a timestamp outside the clock-skew window (ACL on)")
    PRODUCER_BUFFER_FULL = (31, 503, "the producer's send buffer stayed full of unanswered sends for max_block_ms "
                                     "(the brokers are slower than the caller, or unreachable)")

    @property
    def remoting_code(self) -> int:
        """The status number of an error response frame carrying this code."""
        return self.value[0]

    @property
    def http_status(self) -> int:
        """The HTTP status this code maps to."""
        return self.value[1]

    @property
    def description(self) -> str:
        """One line saying what the code means."""
        return self.value[2]

    @classmethod
    def from_remoting_code(cls, number: int) -> ErrorCode | None:
        """The code whose remoting number is ``number``; None for a number this side does not know."""
        return _BY_REMOTING_CODE.get(number)


class SparkMQError(Exception):
    """An error with a stable code; ``str()`` gives ``CODE: message``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        """The HTTP status for this error."""
        return self.code.http_status

    def to_dict(self) -> dict[str, str]:
        """The JSON body APIs return for this error."""
        return {"code": self.code.name, "message": self.message}

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


_BY_REMOTING_CODE = {code.remoting_code: code for code in ErrorCode}
