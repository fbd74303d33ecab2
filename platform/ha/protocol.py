"""The master/slave replication stream (RocketMQ's HA connection), byte for byte.

A slave opens one TCP connection to its master's HA port (HTTP port + 1 by default) and
speaks first; all integers are little-endian::

    slave -> master, once     HELLO   "SMHA" | version u8 | broker id u32 | max offset i64 |
                                      name length u16 | broker name (UTF-8)
    master -> slave, once     WELCOME "SMHA" | version u8 | status u8 | master max offset i64
    master -> slave, repeated TRANSFER  start offset i64 | length u32 | ``length`` bytes of the log
    slave -> master, repeated REPORT    max offset i64 (what the slave holds; its acknowledgement)

After WELCOME with status OK the master streams its log from the slave's max offset in
``TRANSFER`` frames of whole records (at most :data:`TRANSFER_BYTES` each); a frame with length 0
is a heartbeat (sent when there was nothing to send for :data:`HEARTBEAT_INTERVAL_S`).  The slave
appends each frame at exactly its start offset (which must be its own max offset) and answers with
a REPORT of its new max offset; it also reports every :data:`REPORT_INTERVAL_S` when idle.  The
master counts a slave in sync while it is connected and at most ``in_sync_max_gap_bytes`` behind.

A status other than OK (a wrong broker name, a slave ahead of its master) ends the connection
after WELCOME, and nothing was transferred.

**Cluster credential** (:mod:`.cluster_auth`).  A slave with a ``cluster_secret`` says HELLO in
version 2: the version-1 HELLO followed by a proof (timestamp i64 | nonce 16 bytes | mac 32 bytes)
over the HELLO's bytes.  A master that requires the credential (ACL on, or a secret set) answers a
version-1 HELLO or a wrong proof with UNAUTHENTICATED and closes; to a good proof it answers a
version-2 WELCOME followed by its own mac over the slave's nonce, which the slave checks before it
takes anything.  Only an authenticated session also carries the master's ACL table::

    master -> slave, when it changed   ACL   start offset = -1 (:data:`ACL_FRAME`) | length u32 | JSON
"""
from __future__ import annotations

import enum
import struct

__all__ = [
    "ACL_FRAME",
    "HA_MAGIC",
    "HA_VERSION",
    "HA_VERSION_AUTH",
    "MAX_ACL_BYTES",
    "HEARTBEAT_INTERVAL_S",
    "HELLO_FIXED",
    "REPORT",
    "REPORT_INTERVAL_S",
    "TRANSFER_BYTES",
    "TRANSFER_HEADER",
    "WELCOME",
    "HandshakeStatus",
    "MAX_NAME_BYTES",
    "encode_hello",
    "ha_identity",
]

HA_MAGIC = b"SMHA"
HA_VERSION = 1
#: A HELLO / WELCOME carrying the cluster credential (see the module docstring).
HA_VERSION_AUTH = 2
#: The TRANSFER "start offset" of a frame carrying the master's ACL table (JSON) instead of log bytes.
ACL_FRAME = -1
#: Largest ACL table a master sends (a bigger one is not replicated, and says so in the log).
MAX_ACL_BYTES = 16 << 20
#: HELLO without the broker name: magic, version, broker id, max offset, name length.
HELLO_FIXED = struct.Struct("<4sBIqH")
#: WELCOME: magic, version, status, the master's max offset.
WELCOME = struct.Struct("<4sBBq")
#: TRANSFER header: start offset, length.
TRANSFER_HEADER = struct.Struct("<qI")
#: REPORT: the slave's max offset.
REPORT = struct.Struct("<q")
#: Longest broker name a HELLO may carry (the broker config allows 127 characters).
MAX_NAME_BYTES = 512
#: Most log bytes in one TRANSFER (RocketMQ ships ~32 KiB; larger frames cost fewer round trips here).
TRANSFER_BYTES = 256 * 1024
#: An idle master sends an empty TRANSFER this often, so a slave notices a dead master.
HEARTBEAT_INTERVAL_S = 1.0
#: An idle slave reports its offset this often (RocketMQ: 5 s).
REPORT_INTERVAL_S = 5.0


class HandshakeStatus(enum.IntEnum):
    """The master's answer to a HELLO."""

    OK = 0
    #: The slave names another broker (group) than this master's.
    WRONG_BROKER_NAME = 1
    #: The slave holds more log than the master: it cannot follow this master.
    SLAVE_AHEAD = 2
    #: The slave's log ends below what the master still retains: there is a gap to fill by hand.
    SLAVE_BEHIND_RETENTION = 3
    #: A HELLO that is not well formed (magic, version, name).
    BAD_HELLO = 4
    #: This broker is not a master.
    NOT_A_MASTER = 5
    #: No cluster credential, or a wrong / stale / replayed one (the master requires it).
    UNAUTHENTICATED = 6


def encode_hello(broker_name: str, broker_id: int, max_offset: int, *, version: int = HA_VERSION) -> bytes:
    """A slave's HELLO (without the proof a version-2 HELLO is followed by)."""
    name = broker_name.encode("utf-8")
    return HELLO_FIXED.pack(HA_MAGIC, version, broker_id, max_offset, len(name)) + name


def ha_identity(broker_name: str, broker_id: int) -> str:
    """What a slave's proof is bound to: its broker name and id."""
    return f"{broker_name}/{broker_id}"
