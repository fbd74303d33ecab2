"""A broker's membership in its DLedger group: :class:`DLedgerMember`.

It runs a :class:`~.node.RaftNode` over the broker's commit log (:class:`~.store_log.CommitLogRaftLog`)
on the broker's event loop, and turns what the node says into what the broker does:

* **Role.**  Leading opens the store's append gate for the leader's term (in the same loop step the
  node became leader; losing the lead shuts it in the step it was lost, before any entry of a new leader
  is taken).  Role listeners (the broker: register as master or slave, start or stop the services that
  write) hear every change.
* **Commit.**  The commit offset is the store's visibility limit: consumers read committed records only,
  on every member.  Commit listeners hear each advance (the broker wakes the held pulls of the queues
  it covered).
* **Acknowledgement.**  A send on the leader is answered once the group committed its end offset:
  :meth:`DLedgerMember.wait_committed` (a loop future) or :meth:`DLedgerMember.await_committed`
  (blocking) give SEND_OK, FLUSH_SLAVE_TIMEOUT after the wait-for-ack time (the entry may still
  commit), or raise SERVICE_NOT_AVAILABLE when leadership was lost first (outcome unknown).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...auth.model import AclTable
from ...auth.store import AclStore
from ...common.errors import ErrorCode, SparkMQError
from ...common.message import SendStatus
from ...common.tls import TlsSettings
from ...common.waiters import OffsetWaiters
from ...store import MessageStore
from ..acl_copy import apply_acl, encode_acl
from ..cluster_auth import ClusterAuth
from .node import RaftConfig, RaftNode, Role
from .state import RaftState
from .store_log import CommitLogRaftLog

__all__ = ["DLedgerMember", "RoleChange"]

#: How often a leader looks for an ACL change to send its followers.
_ACL_PUSH_INTERVAL_S = 1.0

log = logging.getLogger("sparkmq.dledger")

#: ``listener(leads, term, leader_id)``: called on the loop each time the member's role or leader changes.
RoleChange = Callable[[bool, int, "str | None"], None]


class DLedgerMember:
    """One member of DLedger group ``group`` over ``store`` (started), its files under ``directory``.

    ``members`` maps every member id (this one included) to where its Raft port is reached; this member
    listens on ``host`` at the port of its own entry.  Loop-bound: :meth:`start` on the broker's loop;
    :meth:`await_committed` may be called from any thread.
    """

    def __init__(self, store: MessageStore, directory: str | os.PathLike[str], *, group: str, self_id: str,
                 members: Mapping[str, tuple[str, int]], config: RaftConfig, host: str = "127.0.0.1",
                 tls: TlsSettings | None = None, auth: ClusterAuth | None = None) -> None:
        self.store = store
        self.group = group
        self.self_id = self_id
        self.directory = Path(directory)
        self.log = CommitLogRaftLog(store, self.directory, refusal=self.refusal,
                                    accepting=lambda: self.node.accepting_proposals)
        try:
            self.state = RaftState(self.directory)
            peers = {member: addr for member, addr in members.items() if member != self_id}
            self.node = RaftNode(group, self_id, peers, self.log, self.state, config, host=host,
                                 port=members[self_id][1], on_commit=self._on_commit,
                                 on_role_change=self._on_role_change, tls=tls, auth=auth)
        except BaseException:
            self.log.close()
            raise
        self._members = dict(members)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._wake_pending = False
        self._committed = 0
        self._role_listeners: list[RoleChange] = []
        self._acl_store: AclStore | None = None
        self._acl_task: asyncio.Task[None] | None = None
        self._commit_listeners: list[Callable[[int, int], None]] = []
        self._waiters: OffsetWaiters[SendStatus | SparkMQError] = OffsetWaiters(
            self._acknowledged, config.wait_for_ack_s, ok=SendStatus.SEND_OK,
            timed_out=SendStatus.FLUSH_SLAVE_TIMEOUT,
            unavailable=SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE,
                                     f"{self_id} lost the leadership of {group} before the send committed; "
                                     f"it may still commit (outcome unknown)"))

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> DLedgerMember:
        """Hide everything not known committed, then join the group (listen, wait for a leader or be elected)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        # The commit index is not persisted: nothing is visible until a leader says what is committed.
        self.store.set_visible_offset(0)
        self.log.on_local_append = self._local_append
        await self.node.start()
        if self._acl_store is not None and self.node.authenticated:
            self._acl_task = asyncio.create_task(self._push_acl(self._acl_store), name=f"dledger-acl-{self.self_id}")
        return self

    async def stop(self) -> None:
        """Leave at once (as a crash would); waiting sends fail with SERVICE_NOT_AVAILABLE."""
        if self._acl_task is not None:
            self._acl_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._acl_task
            self._acl_task = None
        self.log.set_writable(None)
        await self.node.stop()
        self._waiters.release(None)

    def close(self) -> None:
        """Lift the store's gate and close the index (after :meth:`stop`, before the store closes)."""
        self.log.close()

    def replicate_acl(self, store: AclStore) -> None:
        """Copy the ACL between members (before :meth:`start`): the leader sends ``store``'s table to every
        follower within about a second of each change, a follower writes the leader's into ``store``.  Only with
        a cluster secret (every connection authenticated); otherwise nothing is copied."""
        self._acl_store = store

        def take(data: bytes) -> None:
            apply_acl(store, data)
        self.node.on_acl = take

    async def _push_acl(self, store: AclStore) -> None:
        sent: dict[str, tuple[int, AclTable]] = {}  # peer -> (term, table) it accepted
        while True:
            await asyncio.sleep(_ACL_PUSH_INTERVAL_S)
            if not self.leads:
                sent.clear()  # a new leadership sends its table again
                continue
            store.maybe_reload()  # changes made through the API (another AclStore over the same file)
            table, term = store.stored, self.term
            data: bytes | None = None
            for peer in self.node.peers:
                done = sent.get(peer)
                if done is not None and done[0] == term and done[1] is table:
                    continue
                data = data if data is not None else encode_acl(table)

                def accepted(ok: bool, peer: str = peer, mark: tuple[int, AclTable] = (term, table)) -> None:
                    if ok:
                        sent[peer] = mark
                self.node.push_acl(peer, data, accepted)

    # -- listeners ------------------------------------------------------------------------------
    def add_role_listener(self, listener: RoleChange) -> None:
        """Call ``listener(leads, term, leader_id)`` on the loop at every role or leader change."""
        self._role_listeners.append(listener)

    def add_commit_listener(self, listener: Callable[[int, int], None]) -> None:
        """Call ``listener(previous, commit)`` on the loop each time the commit offset advances."""
        self._commit_listeners.append(listener)

    # -- what the broker asks -------------------------------------------------------------------
    @property
    def leads(self) -> bool:
        """Whether this member leads (and takes sends)."""
        return self.node.role is Role.LEADER

    @property
    def leader_id(self) -> str | None:
        """The member this one follows (itself when it leads); None while there is no leader."""
        return self.node.leader_id

    @property
    def term(self) -> int:
        """The current term."""
        return self.node.term

    @property
    def member_ids(self) -> list[str]:
        """Every member id, sorted."""
        return sorted(self._members)

    def follower_id(self) -> int:
        """This member's broker id while it follows: 1 + its place among the sorted member ids."""
        return 1 + self.member_ids.index(self.self_id)

    def wait_committed(self, end_offset: int,
                       loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Future[SendStatus | SparkMQError]:
        """A loop future of a send's outcome once the group committed ``end_offset`` (see the module doc)."""
        return self._waiters.wait(end_offset, loop)

    def await_committed(self, end_offset: int) -> SendStatus | SparkMQError:
        """:meth:`wait_committed` for a thread (blocks up to the wait-for-ack time)."""
        return self._waiters.await_offset(end_offset)

    async def transfer_leadership(self, to_id: str) -> None:
        """Hand the leadership to member ``to_id`` (see :meth:`RaftNode.transfer_leadership`)."""
        await self.node.transfer_leadership(to_id)

    def status(self) -> dict[str, Any]:
        """The member as ``GET /broker/dledger`` shows it."""
        status = self.node.status()
        status.update({"group": self.group, "self_id": self.self_id, "members": {
            member: f"{host}:{port}" for member, (host, port) in sorted(self._members.items())},
            "entries": len(self.log), "waiting_sends": len(self._waiters),
            "visible_offset": self.store.visible_offset})
        return status

    # -- node callbacks -------------------------------------------------------------------------
    def refusal(self) -> str:
        """Why this member refuses sends now (who leads instead)."""
        leader = self.node.leader_id
        if leader is None:
            return f"DLedger group {self.group} has no leader now (election in progress)"
        if leader == self.self_id:
            return f"{self.self_id} is handing over the leadership of {self.group}"
        return f"{self.self_id} follows {leader} in DLedger group {self.group}; send to the leader"

    def _acknowledged(self) -> int | None:
        return self._committed if self.node.role is Role.LEADER else None

    def _local_append(self) -> None:
        """A local append (any thread): wake the node once per loop pass, however many appends came.

        Not from inside the append itself (the store is mid-put): first thing in the next loop pass,
        ahead of the I/O that pass reads (on the loop's own thread, without waking it through its pipe).
        """
        if self._wake_pending:
            return
        self._wake_pending = True
        loop = self._loop
        if loop is None:
            return
        try:
            if threading.get_ident() == self._loop_thread:
                loop.call_soon(self._wake_node)
            else:
                loop.call_soon_threadsafe(self._wake_node)
        except RuntimeError:  # the loop closed: the member is stopping
            pass

    def _wake_node(self) -> None:
        self._wake_pending = False
        self.node.log_grew()

    def _on_role_change(self, role: Role, term: int, leader_id: str | None) -> None:
        leads = role is Role.LEADER
        # Same loop step as the change: no local append joins a term this member no longer leads.
        self.log.set_writable(term if leads else None)
        if not leads:
            self._waiters.release(None)
        for listener in list(self._role_listeners):
            try:
                listener(leads, term, leader_id)
            except Exception:
                log.exception("%s/%s: role listener failed", self.group, self.self_id)

    def _on_commit(self, offset: int) -> None:
        previous, self._committed = self._committed, offset
        self.store.set_visible_offset(offset)
        self._waiters.release(offset)
        for listener in list(self._commit_listeners):
            try:
                listener(previous, offset)
            except Exception:
                log.exception("%s/%s: commit listener failed", self.group, self.self_id)
