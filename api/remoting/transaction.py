"""Transactions over remoting: END_TRANSACTION (37, ONEWAY from RocketMQ's clients), and the CHECK_TRANSACTION_STATE
(39) check-backs pushed to a live producer of the group (:func:`check_push`).

A half message is sent as any other (SEND_MESSAGE_V2 with ``TRAN_MSG=true``, :mod:`.send`); its transaction id is
its UNIQ_KEY, which RocketMQ's answer carries as ``transactionId``.
"""
from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from ...platform.auth import Action, Resource
from ...platform.broker.transaction import CheckRequest
from ...platform.common import protocol as p
from ...platform.common.errors import ErrorCode, SparkMQError
from ...platform.common.protocol import TRANSACTION_ACTIONS, RequestCode
from ...platform.remoting import Frame, Reply, ServerConnection
from ...platform.store.message_store import records_of
from ...storage_native import encode_rocketmq_records
from ._common import Handler, NeedsOf, reply, threaded

if TYPE_CHECKING:
    from ...platform.broker.broker import Broker
    from . import BrokerRemoting

__all__ = ["family", "check_push"]


class _Transactions:
    def __init__(self, remoting: BrokerRemoting) -> None:
        self.broker = remoting.broker

    def end_transaction(self, conn: ServerConnection, frame: Frame) -> Awaitable[Reply]:
        """END_TRANSACTION: commit (the message becomes visible), roll back, or leave open (UNKNOWN)."""
        h = frame.header_as(p.EndTransactionRequestHeader)
        action = TRANSACTION_ACTIONS.get(h.commitOrRollback)
        if action is None:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"commitOrRollback must be 0, 8 or 12, got "
                                                           f"{h.commitOrRollback}")
        transactions = self.broker.transaction_processor

        def end() -> Reply:
            transaction_id = h.transactionId or h.msgId
            if not transaction_id:
                if h.commitLogOffset is None:
                    raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                                       "name the transaction by transactionId, msgId or commitLogOffset")
                transaction_id = transactions.transaction_id_at(h.commitLogOffset)
            answer = transactions.end_transaction(transaction_id, h.producerGroup, action, h.fromTransactionCheck)
            sent = answer.get("send_result") or {}
            return reply(p.EndTransactionResponseHeader(
                answer["transaction_id"], answer["action"], sent.get("msg_id"), sent.get("offset_msg_id"),
                sent.get("topic"), sent.get("queue_id"), sent.get("queue_offset"), sent.get("store_timestamp")))
        return threaded(end)


def check_push(broker: Broker, check: CheckRequest) -> tuple[p.CheckTransactionStateRequestHeader, bytes]:
    """The header and body of a CHECK_TRANSACTION_STATE check-back: the half message as a RocketMQ stored record at
    its real topic and queue (its ``PGROUP`` and ``UNIQ_KEY`` properties name the group and the transaction).
    MESSAGE_NOT_FOUND when the half message is gone."""
    half = broker.transaction_processor.check_message(check)
    header = p.CheckTransactionStateRequestHeader(half.topic, half.queue_offset, half.commitlog_offset,
                                                  check.transaction_id, check.transaction_id,
                                                  check.half_offset_msg_id)
    return header, encode_rocketmq_records(records_of([half]))


def family(remoting: BrokerRemoting) -> tuple[dict[int, Handler], dict[int, NeedsOf | str]]:
    """The END_TRANSACTION handler and what it needs with ACL on (Pub on the producer group)."""
    transactions = _Transactions(remoting)
    handlers: dict[int, Handler] = {RequestCode.END_TRANSACTION: transactions.end_transaction}
    needs: dict[int, NeedsOf | str] = {
        RequestCode.END_TRANSACTION: lambda f: [
            (Action.PUB, Resource.group(f.header_as(p.EndTransactionRequestHeader).producerGroup))]}
    return handlers, needs
