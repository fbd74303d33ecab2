"""Transactions: half messages, commit and rollback, check-backs to live producers."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ...common.errors import ErrorCode, SparkMQError
from ...common.message import SendResult, StoredMessage
from ...common.protocol import MAX_LONG_POLL_MS
from ...common.system_topics import (
    DELAY_PROPERTIES,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    TRANS_HALF_TOPIC,
)
from ...common.validation import check_int, validate_group
from ...store import AppendNote, MessageStore
from ..check_channel import CheckChannel
from ..client_manager import ClientManager
from ..config import BrokerConfig
from ..transaction import COMMIT, ROLLBACK, CheckRequest, TransactionService
from .base import BrokerState, Processor, StartedServices
from .send import OutgoingMessage, SendProcessor

__all__ = ["TransactionProcessor"]

log = logging.getLogger("sparkmq.broker")


class TransactionProcessor(Processor):
    """Transactions: half messages, commit and rollback, check-backs to live producers."""

    def __init__(self, state: BrokerState, config: BrokerConfig, store: MessageStore, clients: ClientManager,
                 checks: CheckChannel, services: StartedServices, sender: SendProcessor) -> None:
        super().__init__(state)
        self.config = config
        self.store = store
        self.clients = clients
        self.checks = checks
        self.services = services
        #: Half messages are validated and built as sends are.
        self.sender = sender

    def _tx(self) -> TransactionService:
        transactions = self.services.transactions
        if transactions is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {self.name} runs no transaction service")
        return transactions

    def send_half(self, topic: str, message: OutgoingMessage, producer_group: str, *, queue_id: int | None = None,
                  sharding_key: str | None = None, born_timestamp: int | None = None,
                  born_host: str | None = None) -> dict[str, Any]:
        """Store a transaction's half message (invisible until committed); the answer carries its transaction id."""
        if producer_group is None:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "a half message needs its producer_group")
        with self._operation():
            sending = self.sender
            cfg, qid = sending.prepare_send(topic, queue_id, sharding_key, producer_group, born_timestamp)
            msg, _sys_flag = sending.to_message(topic, message, False)
            if any(name in msg.properties for name in DELAY_PROPERTIES):
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "a transactional message cannot be delayed")
            note = AppendNote("half", topic, status="HALF",
                              detail="transaction half message (invisible until committed)")
            result = self._tx().prepare(msg, qid, producer_group, born_host=born_host, born_timestamp=born_timestamp,
                                        note=note)
        sending.ensure_topic(topic)
        return {"status": str(self.sender.send_status(result.status)), "transaction_id": result.msg_id,
                "msg_id": result.msg_id, "offset_msg_id": result.offset_msg_id, "topic": topic,
                "broker_name": self.name, "queue_id": qid, "queue_offset": result.queue_offset,
                "store_timestamp": result.store_timestamp}

    def end_transaction(self, transaction_id: str, producer_group: str, action: str,
                        from_check: bool = False) -> dict[str, Any]:
        """COMMIT (the message becomes visible), ROLLBACK (never) or UNKNOWN (checks go on) an open transaction.

        TRANSACTION_NOT_FOUND for an unknown or settled id (nothing changes).
        """
        validate_group(producer_group)
        if not isinstance(action, str):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "action must be COMMIT, ROLLBACK or UNKNOWN")
        action = action.upper()
        with self._operation():
            put = self._tx().end(transaction_id, producer_group, action)
        if action in (COMMIT, ROLLBACK):
            self.checks.discard(transaction_id, producer_group)
        send_result = None
        if put is not None:
            status = self.sender.send_status(put.status)
            send_result = SendResult(status, put.msg_id, put.offset_msg_id, put.topic, self.name, put.queue_id,
                                     put.queue_offset, put.store_timestamp, put.commitlog_offset).to_dict()
        log.debug("transaction %s of %s: %s (from check: %s)", transaction_id, producer_group, action, from_check)
        return {"transaction_id": transaction_id, "action": action, "send_result": send_result}

    def transaction_id_at(self, commitlog_offset: int) -> str:
        """The transaction id (UNIQ_KEY) of the half message stored at ``commitlog_offset`` (how RocketMQ's
        END_TRANSACTION names it); TRANSACTION_NOT_FOUND when no half message is stored there."""
        try:
            stored = self.store.read_message(commitlog_offset)
        except SparkMQError as exc:
            raise SparkMQError(ErrorCode.TRANSACTION_NOT_FOUND,
                               f"no half message at commit-log offset {commitlog_offset}: {exc.message}") from None
        if stored.topic != TRANS_HALF_TOPIC or not stored.msg_id:
            raise SparkMQError(ErrorCode.TRANSACTION_NOT_FOUND,
                               f"the message at commit-log offset {commitlog_offset} is not a half message")
        return stored.msg_id

    def check_message(self, check: CheckRequest) -> StoredMessage:
        """The half message a check-back asks about, as a producer is shown it (RocketMQ's check-back body): at its
        real topic and queue, with ``TRANSACTION_CHECK_TIMES``.  MESSAGE_NOT_FOUND when it is gone."""
        stored = self.store.read_by_offset_msg_id(check.half_offset_msg_id)
        props = dict(stored.properties)
        real_topic = props.get(PROPERTY_REAL_TOPIC, stored.topic)
        real_queue = props.get(PROPERTY_REAL_QUEUE_ID)
        props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(check.check_times)
        return dataclasses.replace(stored, topic=real_topic, properties=props,
                                   queue_id=int(real_queue) if real_queue and real_queue.isdigit() else 0)

    def offer_check(self, request: CheckRequest) -> bool:
        # Queued even when no producer is known: one that connects later takes it at once.
        self.checks.offer(request)
        return self.clients.has_producer(request.producer_group)

    async def poll_checks(self, producer_group: str, client_id: str | None = None,
                          wait_ms: int = 0) -> list[dict[str, Any]]:
        """Long poll for check-backs due for ``producer_group`` (each goes to one poller); [] at the timeout.

        A polling ``client_id`` counts as a live producer of the group (a heartbeat).
        """
        validate_group(producer_group)
        check_int("wait_ms", wait_ms, 0, MAX_LONG_POLL_MS)
        if client_id:
            self.clients.heartbeat(client_id, [producer_group])
        timeout = min(wait_ms, self.config.long_polling_max_ms * 2) / 1000.0 if self.running else 0.0
        taken = await self.checks.poll(producer_group, timeout)
        return [{"transaction_id": c.transaction_id, "topic": c.topic, "msg_id": c.transaction_id,
                 "offset_msg_id": c.half_offset_msg_id, "check_times": c.check_times, "body": c.body,
                 "properties": c.properties} for c in taken]


