"""The transaction producer: half message, local transaction, commit or rollback, and check-backs.

:meth:`TransactionProducer.send_message_in_transaction`:

1. sends a *half* message (``POST /topics/{topic}/half``): stored by the broker, invisible to consumers;
2. runs the caller's local transaction ``local_transaction(msg, arg)``, which answers COMMIT,
   ROLLBACK or UNKNOWN (an exception counts as UNKNOWN);
3. ends the transaction on the same broker (``POST /transactions/{id}``): COMMIT makes the message
   visible in its topic, ROLLBACK drops it, UNKNOWN leaves it to the check-backs.

**Check-backs.**  When a half message stays unsettled (the producer answered UNKNOWN, or died
between steps 1 and 3), the broker asks a live producer of the same group -- first after 6 s, then
every 30 s, at most 15 times, then it discards the message.  This producer keeps one long poll
``GET /transactions/checks`` open per master broker (of the routes it used, and every master the
name servers list, so a fresh producer answers for one that died), hands each check to
``check_listener(check) -> state`` and ends the transaction with ``from_check: true``.

Example::

    def local(msg, arg):
        db.insert(arg)            # the local transaction
        return TransactionState.COMMIT

    producer = TransactionProducer("pg", ClientConfig(namesrv_addrs="127.0.0.1:9876"),
                                   check_listener=lambda check: TransactionState.COMMIT)
    producer.start()
    result = producer.send_message_in_transaction(Message("orders", b"..."), local, arg=order)
    producer.shutdown()
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import httpx

from ..common.backoff import Backoff, RetryDelays
from ..common.errors import ErrorCode, SparkMQError
from ..common.message import PROPERTY_TAGS, Message
from ..common.wire import decode_body
from .allocation import MessageQueue
from .config import ClientConfig
from .producer import Producer, SendResult, SendStatus
from .routes import MASTER_ID

__all__ = ["TransactionProducer", "TransactionState", "TransactionSendResult", "TransactionCheck",
           "LocalTransactionFn", "CheckListener"]

log = logging.getLogger("sparkmq.client")

#: The pause after a failed check-back poll: 0.2 s doubling to 5 s, from 0.2 s again after a poll that worked.
_CHECK_POLL_RETRY = Backoff(initial_s=0.2, max_s=5.0)


class TransactionState(StrEnum):
    """A local transaction's outcome (RocketMQ's ``LocalTransactionState``)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    #: Not known yet: the broker will check back.
    UNKNOWN = "UNKNOWN"


#: RocketMQ's spellings, accepted from listeners.
_ALIASES = {"COMMIT_MESSAGE": "COMMIT", "ROLLBACK_MESSAGE": "ROLLBACK", "UNKNOW": "UNKNOWN"}


def _state(value: object) -> TransactionState:
    """A listener's answer as a state; anything unrecognised (None included) is UNKNOWN."""
    text = str(getattr(value, "value", value) or "").upper()
    try:
        return TransactionState(_ALIASES.get(text, text))
    except ValueError:
        log.warning("transaction listener answered %r; treating it as UNKNOWN", value)
        return TransactionState.UNKNOWN


@dataclass(frozen=True)
class TransactionCheck:
    """A broker's question about one unsettled half message."""

    transaction_id: str
    topic: str
    msg_id: str
    check_times: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def tags(self) -> str | None:
        """The message's tag."""
        return self.properties.get(PROPERTY_TAGS)


@dataclass(frozen=True)
class TransactionSendResult:
    """The half message's send result, its transaction id, and the local transaction's outcome."""

    send_result: SendResult
    transaction_id: str
    local_state: TransactionState
    #: Whether ending the transaction reached the broker (False: the check-backs will settle it).
    ended: bool = True

    @property
    def msg_id(self) -> str:
        """The message's unique id."""
        return self.send_result.msg_id


#: ``local_transaction(message, arg) -> TransactionState`` (or its name).
LocalTransactionFn = Callable[[Message, Any], Any]
#: ``check_listener(check) -> TransactionState`` (or its name).
CheckListener = Callable[[TransactionCheck], Any]


class TransactionProducer(Producer):
    """A :class:`Producer` that also sends transactional messages and answers the brokers' check-backs.

    Args:
        group: the producer group; check-backs go to any live producer of it.
        config: client settings.
        check_listener: answers check-backs; without one, checks are answered UNKNOWN (RocketMQ needs
            a listener; here a producer that only sends may leave checks to another member).
        check_wait_ms: how long one check long poll waits on the broker (bounds :meth:`shutdown` too).
        check_threads_sync_s: how often the set of brokers polled for checks is brought up to date.
    """

    def __init__(self, group: str, config: ClientConfig, *, check_listener: CheckListener | None = None,
                 check_wait_ms: int = 5000, check_threads_sync_s: float | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(group, config, transport=transport)
        if check_wait_ms < 0:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"check_wait_ms must be >= 0, got {check_wait_ms!r}")
        self.check_listener = check_listener
        self.check_wait_ms = check_wait_ms
        self._sync_s = check_threads_sync_s or config.heartbeat_interval_s
        self._stop = threading.Event()
        self._checkers: dict[str, threading.Thread] = {}
        self._checkers_lock = threading.Lock()
        self._check_stats = {"checks": 0, "answered": 0, "failed": 0}
        self._stats_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> TransactionProducer:
        """Start the producer and one check-back poller per master broker; returns self."""
        super().start()
        self.sync_checkers()
        self._scheduler.every("tx-checkers", self._sync_s, self.sync_checkers, initial_delay_s=self._sync_s)
        return self

    def shutdown(self) -> None:
        """Stop the check pollers (each finishes its open long poll), then shut the producer down."""
        self._stop.set()
        with self._checkers_lock:
            threads = list(self._checkers.values())
        for thread in threads:
            thread.join(self.check_wait_ms / 1000 + self.config.request_timeout_s + 1)
        super().shutdown()

    def __enter__(self) -> TransactionProducer:
        return self.start() if self._state == "created" else self

    @property
    def check_stats(self) -> dict[str, int]:
        """Counters: ``checks`` received, ``answered`` (ended on the broker), ``failed`` (not ended)."""
        with self._stats_lock:
            return dict(self._check_stats)

    def _count(self, key: str) -> None:
        with self._stats_lock:
            self._check_stats[key] += 1

    # -- sending -----------------------------------------------------------------------------------
    def send_message_in_transaction(self, msg: Message, local_transaction: LocalTransactionFn, arg: Any = None,
                                    timeout: float | None = None) -> TransactionSendResult:
        """Send ``msg`` as a half message, run ``local_transaction(msg, arg)`` and end the transaction with its answer.

        Raises ``SparkMQError`` when the half message cannot be stored (the local transaction does
        not run then).  An exception of the local transaction is logged and counts as UNKNOWN.
        """
        self._check_running()
        prepared = self._prepare(msg, compress=False)  # check-backs hand the stored body to the listener
        holder: dict[str, Any] = {}

        def attempt(addr: str, mq: MessageQueue, left: float) -> SendResult:
            payload = self._payload(prepared, mq, None)
            answer = self._brokers.get(addr).send_half(prepared.topic, payload, timeout=left)
            holder["addr"], holder["transaction_id"] = addr, str(answer["transaction_id"])
            holder["offset_msg_id"], holder["queue_offset"] = answer.get("offset_msg_id"), answer.get("queue_offset")
            answer.setdefault("status", SendStatus.SEND_OK.value)
            answer.setdefault("topic", prepared.topic)
            answer.setdefault("broker_name", mq.broker_name)
            answer.setdefault("queue_id", mq.queue_id)
            answer.setdefault("queue_offset", -1)
            return SendResult.from_dict(answer)

        result = self._with_retries(prepared.topic, timeout, None, attempt)
        with self._checkers_lock:
            polled = holder["addr"] in self._checkers
        if not polled:
            self.sync_checkers()  # a broker met for the first time: be ready for its check-backs
        try:
            state = _state(local_transaction(msg, arg))
        except Exception:
            log.exception("local transaction of %s failed; its outcome is UNKNOWN", result.msg_id)
            state = TransactionState.UNKNOWN
        ended = True
        try:
            self._brokers.get(holder["addr"]).end_transaction(holder["transaction_id"], self.group, state.value,
                                                              offset_msg_id=holder["offset_msg_id"],
                                                              queue_offset=holder["queue_offset"])
        except SparkMQError as exc:
            # Not fatal: the half message stays until a check-back settles it.
            log.warning("ending transaction %s (%s) failed: %s", holder["transaction_id"], state.value, exc)
            ended = False
        return TransactionSendResult(result, holder["transaction_id"], state, ended)

    def end_transaction(self, transaction_id: str, state: TransactionState | str, *,
                        broker_addr: str) -> dict[str, Any]:
        """End a transaction by hand on ``broker_addr``; TRANSACTION_NOT_FOUND when unknown or already settled."""
        return self._brokers.get(broker_addr).end_transaction(transaction_id, self.group, _state(state).value)

    # -- check-backs -------------------------------------------------------------------------------
    def _master_addrs(self) -> set[str]:
        addrs = set(self._known_addrs())
        try:
            info = self._namesrv.cluster_info()
        except SparkMQError as exc:
            log.debug("cluster view for check-backs not available: %s", exc)
            return addrs
        for broker in (info.get("brokers") or {}).values():
            master = ((broker or {}).get("broker_addrs") or {}).get(str(MASTER_ID))
            if master:
                addrs.add(master)
        return addrs

    def sync_checkers(self) -> None:
        """Start a check-back poller for every master broker that has none (done periodically)."""
        if self._stop.is_set():
            return
        for addr in sorted(self._master_addrs()):
            with self._checkers_lock:
                thread = self._checkers.get(addr)
                if thread is not None and thread.is_alive():
                    continue
                thread = threading.Thread(target=self._poll_checks, args=(addr,), daemon=True,
                                          name=f"sparkmq-txcheck-{self.group}-{addr}")
                self._checkers[addr] = thread
            self._heartbeat_one(addr)
            thread.start()

    def _heartbeat_one(self, addr: str) -> None:
        try:
            self._brokers.get(addr).heartbeat({"client_id": self.client_id, "producer_groups": [self.group],
                                               "consumers": []})
        except SparkMQError as exc:
            log.debug("producer heartbeat to %s failed: %s", addr, exc)

    def send_heartbeats(self) -> None:
        """Heartbeat the masters sent to and those polled for check-backs."""
        super().send_heartbeats()
        with self._checkers_lock:
            extra = sorted(set(self._checkers) - set(self._known_addrs()))
        for addr in extra:
            self._heartbeat_one(addr)

    def _poll_checks(self, addr: str) -> None:
        delays = RetryDelays(_CHECK_POLL_RETRY)
        while not self._stop.is_set():
            try:
                checks = self._brokers.get(addr).transaction_checks(self.group, self.client_id, self.check_wait_ms)
            except SparkMQError as exc:
                if self._stop.is_set():
                    return
                log.debug("check-back poll on %s failed: %s", addr, exc)
                self._stop.wait(delays.next_s())
                continue
            delays.reset()
            for raw in checks:
                self._answer(addr, raw)

    def _answer(self, addr: str, raw: dict[str, Any]) -> None:
        self._count("checks")
        try:
            check = TransactionCheck(str(raw["transaction_id"]), str(raw.get("topic", "")), str(raw.get("msg_id", "")),
                                     int(raw.get("check_times") or 0), decode_body(raw.get("body") or ""),
                                     dict(raw.get("properties") or {}))
        except (KeyError, ValueError, SparkMQError) as exc:
            log.warning("malformed check-back from %s: %s", addr, exc)
            self._count("failed")
            return
        if self.check_listener is None:
            state = TransactionState.UNKNOWN
        else:
            try:
                state = _state(self.check_listener(check))
            except Exception:
                log.exception("check listener failed on transaction %s; answering UNKNOWN", check.transaction_id)
                state = TransactionState.UNKNOWN
        try:
            self._brokers.get(addr).end_transaction(check.transaction_id, self.group, state.value, from_check=True,
                                                    offset_msg_id=raw.get("offset_msg_id") or None,
                                                    queue_offset=raw.get("queue_offset"))
            self._count("answered")
        except SparkMQError as exc:
            log.info("answering the check of %s (%s) failed: %s", check.transaction_id, state.value, exc)
            self._count("failed")
