"""Stable error codes of sparkmq, each mapped once to a remoting response code and an HTTP status.

Every API answers bad input with one of these codes; the hot path returns status
values instead (see ``platform.store.status``), and the processor layer turns both
into responses.  Codes are part of the public contract: never rename one.
"""
from __future__ import annotations

from enum import Enum

__all__ = ["ErrorCode", "SparkMQError"]


class ErrorCode(Enum):
    """(remoting response code, HTTP status, one-line meaning) of every stable error code.

    The remoting response code is RocketMQ's ``ResponseCode`` that RocketMQ's own servers answer in the
    same case, so the official clients react as they do to Apache RocketMQ (a SYSTEM_BUSY is retried, a
    TOPIC_NOT_EXIST refreshes the route).  Several codes share one response code; an error response names
    the exact code in its ``errorCode`` ext field (docs/remoting.md, "Errors"), and
    :meth:`from_remoting_code` maps a bare response code back to the code listed first for it.
    """

    INVALID_ARGUMENT = (29, 400, "a parameter is missing, of the wrong type or out of range")
    TOPIC_ILLEGAL = (29, 400, "the topic name is empty, too long or has characters outside [%|a-zA-Z0-9_-]")
    GROUP_ILLEGAL = (29, 400, "the group name is empty, too long or has characters outside [%|a-zA-Z0-9_-]")
    MESSAGE_ILLEGAL = (13, 400, "the message is malformed (empty body, bad property names or values, bad tag)")
    MESSAGE_TOO_LARGE = (13, 413, "the message body exceeds the maximum message size")
    PROPERTIES_TOO_LARGE = (13, 413, "the encoded message properties exceed the limit")
    QUEUE_ID_ILLEGAL = (29, 400, "the queue id is negative or not below the topic's queue count")
    OFFSET_ILLEGAL = (29, 400, "the offset is negative, not an integer, or not the start of a message")
    MESSAGE_ID_ILLEGAL = (29, 400, "the message id cannot be decoded")
    TOPIC_NOT_EXIST = (17, 404, "the topic does not exist")
    MESSAGE_NOT_FOUND = (22, 404, "no message at that id or offset")
    NO_PERMISSION = (16, 403, "the topic's perm forbids this operation, or the ACL does not allow the caller "
                              "this action on this resource from this address")
    STORE_LOCKED = (1, 409, "another process has the store open")
    SERVICE_NOT_AVAILABLE = (14, 503, "the service is starting, stopping or read-only")
    SLAVE_NOT_AVAILABLE = (11, 503, "no in-sync slave is available for a SYNC_MASTER write")
    FLUSH_DISK_TIMEOUT = (10, 504, "the message was stored but not flushed within the timeout")
    DISK_FULL = (14, 507, "the disk has no room for the store")
    STORE_CORRUPT = (1, 500, "the store's files are damaged")
    INTERNAL_ERROR = (1, 500, "an unexpected failure")
    FILTER_EXPRESSION_ILLEGAL = (23, 400, "a tag or SQL92 filter expression does not parse; the message says where")
    TRANSACTION_NOT_FOUND = (1, 404, "no pending half message has that transaction id (settled, discarded or unknown)")
    GROUP_NOT_EXIST = (26, 404, "the consumer group has no members and no committed offsets on this broker")
    CONSUMER_NOT_ONLINE = (206, 404, "the client a request is relayed to (GET_CONSUMER_RUNNING_INFO) has no live "
                                     "connection to this broker")
    SUBSCRIPTION_NOT_EXIST = (24, 404, "a pull carried no filter and no member of its group subscribes to the topic "
                                       "on this broker")
    REQUEST_CODE_NOT_SUPPORTED = (3, 400, "the remoting request code is unknown to this server")
    LAKE_NOT_AVAILABLE = (14, 503, "the answer needs the lake (the key index), and this broker runs none")
    STALE_EPOCH = (1, 409, "a DLedger leader of an older term tried to register as master over a newer one")
    DLEDGER_NOT_ENABLED = (1, 404, "the broker is not a member of a DLedger group (dledger_enabled is off)")
    LEADERSHIP_TRANSFER_FAILED = (1, 409, "a DLedger leadership transfer did not complete in time "
                                          "(target behind or unreachable, it did not win, or the lead was lost)")
    INVALID_RECEIPT_HANDLE = (29, 400, "the POP receipt handle is malformed, of another group or topic, stale "
                                       "(acked, redelivered or renewed since) or past its invisible time")
    INVISIBLE_TIME_ILLEGAL = (29, 400, "a POP invisible time is outside the allowed range")
    AUTHENTICATION_FAILED = (16, 401, "the request carries no credentials, an unknown access key, a bad signature, "
                                      "or a timestamp outside the clock-skew window (ACL on)")
    PRODUCER_BUFFER_FULL = (2, 503, "the producer's send buffer stayed full of unanswered sends for max_block_ms "
                                    "(the brokers are slower than the caller, or unreachable)")
    SYSTEM_BUSY = (2, 503, "the broker is overloaded (a request waited too long in its queue); back off and retry")

    @property
    def remoting_code(self) -> int:
        """The response code (RocketMQ's ``ResponseCode``) of an error response carrying this code."""
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
        """The code a bare response code stands for (the one listed first for it); None for a number that is no
        error code here (a success, a pull's or a send's outcome, or one this side does not know)."""
        return _BY_REMOTING_CODE.get(number)

    @classmethod
    def from_name(cls, name: object) -> ErrorCode | None:
        """The code named ``name`` (an error response's ``errorCode`` field); None for any other value."""
        return cls.__members__.get(name) if isinstance(name, str) else None


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


# The first code listed for each response code, except where a more general one is the better reading of a bare
# number from another server: 1 is any failure, 2 any overload, 14 any unavailability.
_BY_REMOTING_CODE: dict[int, ErrorCode] = {}
for _code in ErrorCode:
    _BY_REMOTING_CODE.setdefault(_code.remoting_code, _code)
_BY_REMOTING_CODE.update({1: ErrorCode.INTERNAL_ERROR, 2: ErrorCode.SYSTEM_BUSY})
