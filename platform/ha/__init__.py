"""Master/slave replication (RocketMQ's HA): a slave copies its master's commit log byte for byte.

* :mod:`.protocol` -- the stream between them (HELLO, WELCOME, TRANSFER, REPORT), in bytes.
* :class:`ReplicationMaster` -- the master's HA port: streams the log to each slave and answers
  SYNC_MASTER sends once a slave acknowledged them.
* :class:`ReplicationSlave` -- the slave's thread: appends what the master sends at the same
  offsets (its consume queues are rebuilt from the records) and reports how far it got.

Design and safety argument: ``docs/ha.md``.
"""
from __future__ import annotations

from .master import DEFAULT_FLUSH_SLAVE_TIMEOUT_S, DEFAULT_IN_SYNC_MAX_GAP_BYTES, ReplicationMaster, SlaveState
from .protocol import HandshakeStatus
from .slave import ReplicationSlave

__all__ = [
    "DEFAULT_FLUSH_SLAVE_TIMEOUT_S",
    "DEFAULT_IN_SYNC_MAX_GAP_BYTES",
    "HandshakeStatus",
    "ReplicationMaster",
    "ReplicationSlave",
    "SlaveState",
]
