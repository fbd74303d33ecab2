"""One member of a DLedger group: Raft leader election, log replication and majority commit on an event loop.

:class:`RaftNode` runs on one asyncio loop (a broker's uvloop loop); every state change happens in a
synchronous step -- a request handler, a reply handler, a timer -- with no ``await`` inside it, so no
two steps interleave.  Disk writes (the state file, the log) are made inside those steps, before the
reply that depends on them leaves.

Roles and timers (every timing is a :class:`RaftConfig` field; defaults are RocketMQ DLedger's):

* FOLLOWER: answers the leader; when it has heard no valid leader for ``heartbeat_interval_s *
  max_missed_heartbeats`` plus a random ``election_jitter_s`` it becomes a PRE_CANDIDATE.
* PRE_CANDIDATE: asks every peer "would you vote for me in term+1?" (pre-vote) without changing any
  term; only with a majority of yeses does it become a CANDIDATE.  A node cut off from the majority
  therefore never raises its term, and cannot depose a healthy leader when it comes back.
* CANDIDATE: term+1, votes for itself (persisted first), asks for votes; a majority makes it LEADER,
  a higher term makes it a FOLLOWER, nothing within ``heartbeat_interval_s`` + jitter starts a new round.
* LEADER: appends a no-op entry of its term (so entries of earlier terms commit with it), streams
  AppendEntries to each peer (up to :data:`PIPELINE_DEPTH` RPCs in flight per peer, sent in the step
  that appended, batches of at most ``max_append_bytes``, an empty one as heartbeat every
  ``heartbeat_interval_s``), and advances the commit offset to the
  highest offset held by a majority whose entry is of its own term.  With ``check_quorum`` it steps
  down when a majority has not answered within the leader-lost time.

A node that has heard a live leader within the leader-lost time ignores vote requests (a leader
lease) unless they come from a leadership transfer, so a flapping node cannot depose a healthy leader.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...common.errors import ErrorCode, SparkMQError
from ...common.tls import TlsSettings
from ..cluster_auth import ClusterAuth
from .log import RaftLog
from .messages import (
    AclReply,
    AclRequest,
    AppendReply,
    AppendRequest,
    Entry,
    Refusal,
    Reply,
    Request,
    TimeoutNowReply,
    TimeoutNowRequest,
    VoteReply,
    VoteRequest,
    frame_parts,
)
from .state import RaftState
from .transport import RaftTransport, RpcError

__all__ = [
    "DEFAULT_ELECTION_JITTER_S",
    "DEFAULT_HEARTBEAT_INTERVAL_S",
    "DEFAULT_MAX_APPEND_BYTES",
    "DEFAULT_MAX_MISSED_HEARTBEATS",
    "DEFAULT_WAIT_FOR_ACK_S",
    "NOOP_PREFIX",
    "LeadershipLostError",
    "LeadershipTransferError",
    "NotLeaderError",
    "PeerProgress",
    "ProposalFailedError",
    "ProposalTimeoutError",
    "RaftConfig",
    "RaftNode",
    "Role",
    "default_noop_entry",
    "is_noop_entry",
]

log = logging.getLogger("sparkmq.ha.dledger")

#: RocketMQ DLedger heartBeatTimeIntervalMs.
DEFAULT_HEARTBEAT_INTERVAL_S = 2.0
#: RocketMQ DLedger maxHeartBeatLeak: the leader is lost after this many missed heartbeats.
DEFAULT_MAX_MISSED_HEARTBEATS = 3
#: RocketMQ DLedger's random extra wait before an election (minVoteIntervalMs..maxVoteIntervalMs).
DEFAULT_ELECTION_JITTER_S = (0.3, 1.0)
#: RocketMQ DLedger maxWaitAckTimeMs: a proposal not committed by then fails (its outcome is unknown).
DEFAULT_WAIT_FOR_ACK_S = 2.5
#: Most entry bytes in one AppendEntries (a follower far behind catches up in batches of this size).
DEFAULT_MAX_APPEND_BYTES = 1 << 20
#: A new leader's no-op entry starts with this (then its term, 8 bytes little-endian).
NOOP_PREFIX = b"\x00SMRAFT-NOOP\x00"
#: AppendEntries with entries in flight to one follower at once.
PIPELINE_DEPTH = 4
#: A follower's retry hint walks back over at most this many entries of a conflicting term.
_MAX_HINT_STEPS = 100_000


def default_noop_entry(term: int) -> bytes:
    """The no-op entry a new leader of ``term`` appends (the store integration supplies its own marker)."""
    return NOOP_PREFIX + term.to_bytes(8, "little")


def is_noop_entry(data: bytes) -> bool:
    """Whether ``data`` is a :func:`default_noop_entry`."""
    return data.startswith(NOOP_PREFIX) and len(data) == len(NOOP_PREFIX) + 8


class Role(enum.Enum):
    """What a node is doing in the group."""

    FOLLOWER = "FOLLOWER"
    PRE_CANDIDATE = "PRE_CANDIDATE"
    CANDIDATE = "CANDIDATE"
    LEADER = "LEADER"


@dataclass(frozen=True)
class RaftConfig:
    """Timings and options of a node; validated at construction (``ValueError`` names the bad value)."""

    #: The leader sends AppendEntries (empty: a heartbeat) to each peer at least this often.
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    #: A follower considers the leader lost after this many heartbeat intervals without one.
    max_missed_heartbeats: int = DEFAULT_MAX_MISSED_HEARTBEATS
    #: Random extra wait (low, high) before an election, so nodes rarely time out together.
    election_jitter_s: tuple[float, float] = DEFAULT_ELECTION_JITTER_S
    #: How long an RPC waits for its reply (None: one heartbeat interval).
    rpc_timeout_s: float | None = None
    #: A proposal not committed within this fails with :class:`ProposalTimeoutError`.
    wait_for_ack_s: float = DEFAULT_WAIT_FOR_ACK_S
    #: Most entry bytes per AppendEntries.
    max_append_bytes: int = DEFAULT_MAX_APPEND_BYTES
    #: Ask for pre-votes before raising the term.
    pre_vote: bool = True
    #: A leader that has not heard from a majority within the leader-lost time steps down.
    check_quorum: bool = True
    #: The member that should lead whenever it is healthy and caught up (the leader transfers to it).
    preferred_leader: str | None = None
    #: How long a leadership transfer may take (None: the leader-lost time plus the highest jitter).
    transfer_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not self.heartbeat_interval_s > 0:
            raise ValueError(f"heartbeat_interval_s must be > 0, got {self.heartbeat_interval_s!r}")
        if self.max_missed_heartbeats < 1:
            raise ValueError(f"max_missed_heartbeats must be >= 1, got {self.max_missed_heartbeats!r}")
        low, high = self.election_jitter_s
        if not 0 <= low <= high:
            raise ValueError(f"election_jitter_s must be 0 <= low <= high, got {self.election_jitter_s!r}")
        for name in ("rpc_timeout_s", "transfer_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if not self.wait_for_ack_s > 0:
            raise ValueError(f"wait_for_ack_s must be > 0, got {self.wait_for_ack_s!r}")
        if self.max_append_bytes < 1:
            raise ValueError(f"max_append_bytes must be >= 1, got {self.max_append_bytes!r}")

    @property
    def leader_lost_s(self) -> float:
        """Silence after which a follower considers its leader lost (and the leader lease ends)."""
        return self.heartbeat_interval_s * self.max_missed_heartbeats

    @property
    def rpc_timeout(self) -> float:
        """``rpc_timeout_s`` or its default."""
        return self.rpc_timeout_s if self.rpc_timeout_s is not None else self.heartbeat_interval_s

    @property
    def transfer_timeout(self) -> float:
        """``transfer_timeout_s`` or its default."""
        if self.transfer_timeout_s is not None:
            return self.transfer_timeout_s
        return self.leader_lost_s + self.election_jitter_s[1]


class NotLeaderError(SparkMQError):
    """This node does not lead its group; ``leader_id`` (and ``leader_address``) name the leader when known."""

    def __init__(self, group: str, node_id: str, leader_id: str | None,
                 leader_address: tuple[str, int] | None, reason: str = "") -> None:
        where = f"the leader is {leader_id}" if leader_id else "the leader is not known"
        if leader_address is not None:
            where += f" ({leader_address[0]}:{leader_address[1]})"
        super().__init__(ErrorCode.SERVICE_NOT_AVAILABLE,
                         f"{node_id} of DLedger group {group} is not the leader{reason}; {where}")
        self.leader_id = leader_id
        self.leader_address = leader_address


class ProposalFailedError(SparkMQError):
    """A proposal was not acknowledged; its entry may still commit (the outcome is unknown)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.SERVICE_NOT_AVAILABLE, message)


class LeadershipLostError(ProposalFailedError):
    """The leader stepped down (or stopped) before the proposal committed."""


class ProposalTimeoutError(ProposalFailedError):
    """The proposal did not commit within ``wait_for_ack_s`` (no majority answered in time)."""


class LeadershipTransferError(SparkMQError):
    """A leadership transfer did not complete (target not caught up, did not win, or leadership was lost)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.SERVICE_NOT_AVAILABLE, message)


@dataclass
class PeerProgress:
    """What a leader knows about one follower."""

    #: Where the next AppendEntries starts (an entry boundary of the leader's log).
    next_offset: int
    #: The follower's log matches the leader's up to here (its acknowledgement).
    match_offset: int = 0
    #: The commit offset told in the last AppendEntries.
    commit_sent: int = 0
    #: Loop time of the last AppendEntries sent, and of the last reply in this term (-inf: none yet).
    last_sent: float = float("-inf")
    last_ack: float = float("-inf")
    #: Calls that failed (no connection, no reply in time).
    failures: int = 0
    #: AppendEntries sent and not answered yet, oldest first (the follower answers in order).
    inflight: collections.deque[AppendRequest] = field(default_factory=collections.deque)
    #: Loop time before which nothing is sent after a failed call (0: no back-off).
    retry_at: float = 0.0
    #: Set to make the peer's replicator task look again (a back-off to schedule, a transfer).
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class _Proposal:
    __slots__ = ("start", "end", "future", "timer")

    def __init__(self, start: int, end: int, future: asyncio.Future[tuple[int, int]]) -> None:
        self.start = start
        self.end = end
        self.future = future
        self.timer: asyncio.TimerHandle | None = None


CommitListener = Callable[[int], None]
RoleListener = Callable[[Role, int, "str | None"], None]


class RaftNode:
    """A member of DLedger group ``group``: ``node_id`` among ``peers`` (id -> (host, port) they listen on).

    ``log`` and ``state`` are the node's persistent storage (the caller opens and closes them); the
    node listens on ``host:port`` (0 = a free port) once :meth:`start` ran.  Everything must be called
    on the loop that ran :meth:`start`.  Example::

        node = RaftNode("broker-a", "n0", {"n1": ("10.0.0.2", 40911), "n2": ("10.0.0.3", 40911)},
                        FileRaftLog(data / "raft"), RaftState(data / "raft"), RaftConfig())
        await node.start()
        start, end = await node.propose(batch)      # committed on a majority
    """

    def __init__(self, group: str, node_id: str, peers: Mapping[str, tuple[str, int]], log: RaftLog,
                 state: RaftState, config: RaftConfig | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 noop_entry: Callable[[int], bytes] = default_noop_entry,
                 on_commit: CommitListener | None = None, on_role_change: RoleListener | None = None,
                 rng: random.Random | None = None, tls: TlsSettings | None = None,
                 auth: ClusterAuth | None = None) -> None:
        if not group or not node_id:
            raise ValueError(f"group and node id must not be empty: {group!r}, {node_id!r}")
        if node_id in peers:
            raise ValueError(f"node {node_id!r} lists itself among its peers")
        self.group = group
        self.node_id = node_id
        self.log = log
        self.config = config if config is not None else RaftConfig()
        if self.config.preferred_leader is not None and self.config.preferred_leader not in {node_id, *peers}:
            raise ValueError(f"preferred leader {self.config.preferred_leader!r} is not a member of {group!r}")
        self._state = state
        self._host, self._port = host, port
        self._noop_entry = noop_entry
        self._rng = rng if rng is not None else random.Random()
        self._transport = RaftTransport(group, node_id, peers, self._on_request, tls=tls, auth=auth)
        self._role = Role.FOLLOWER
        self._leader_id: str | None = None
        self._reported: tuple[Role, int, str | None] | None = None
        self._commit = 0
        self._leader_seen_at = float("-inf")
        self._leader_since = float("-inf")
        self._election_timer: asyncio.TimerHandle | None = None
        self._round = 0  # elections (pre-vote and real) started; replies to older rounds are ignored
        self._votes: set[str] = set()
        self._progress: dict[str, PeerProgress] = {}
        #: The last AppendEntries built, by (term, prev offset, log end, commit): the next follower in step
        #: gets the same one (see :meth:`_send_append`).
        self._shared_append: tuple[tuple[int, int, int, int], AppendRequest, tuple[bytes, bytes]] | None = None
        self._proposals: collections.deque[_Proposal] = collections.deque()
        self._transfer_target: str | None = None
        self._next_preferred_try = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._leader_tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        self._commit_listeners: list[CommitListener] = [on_commit] if on_commit else []
        self._role_listeners: list[RoleListener] = [on_role_change] if on_role_change else []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._stopped = False
        #: Called off the loop with the leader's ACL table (JSON) when it sends one; None: not taken.
        self.on_acl: Callable[[bytes], None] | None = None
        #: Counters: elections, appends sent and received, entries and bytes replicated, truncations, ...
        self.stats: collections.Counter[str] = collections.Counter()

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> RaftNode:
        """Listen and arm the election timer (a node starts as a follower of nobody)."""
        if self._started:
            raise RuntimeError(f"{self.node_id} already started")
        self._started = True
        self._loop = asyncio.get_running_loop()
        await self._transport.start(self._host, self._port)
        self._report_role()
        self._reset_election_timer()
        log.info("%s/%s: listening on %s:%d, term %d, log end %d", self.group, self.node_id, *self.address,
                 self.term, self.log.last()[0])
        return self

    async def stop(self) -> None:
        """Stop at once, as a crash would: no goodbye; connections aborted, proposals failed, tasks cancelled."""
        if self._stopped:
            return
        self._stopped = True
        self._cancel_election_timer()
        self._fail_proposals(LeadershipLostError(f"{self.node_id} stopped"))
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await self._transport.close()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._notify()

    # -- what the group looks like from here ----------------------------------------------------
    @property
    def role(self) -> Role:
        """This node's role."""
        return self._role

    @property
    def term(self) -> int:
        """The current term (persisted)."""
        return self._state.term

    @property
    def voted_for(self) -> str | None:
        """Whom this node voted for in the current term (persisted)."""
        return self._state.voted_for

    @property
    def leader_id(self) -> str | None:
        """The leader this node follows (itself when leading); None when not known."""
        return self._leader_id

    @property
    def commit_index(self) -> int:
        """The commit offset: the log up to here is committed (never goes back)."""
        return self._commit

    @property
    def is_leader(self) -> bool:
        """Whether this node leads (and is running)."""
        return self._role is Role.LEADER and not self._stopped

    @property
    def running(self) -> bool:
        """Started and not stopped."""
        return self._started and not self._stopped

    @property
    def address(self) -> tuple[str, int]:
        """The ``(host, port)`` this node listens on (after :meth:`start`)."""
        return self._transport.address

    @property
    def peers(self) -> dict[str, tuple[str, int]]:
        """Peer id -> the address this node dials it at."""
        return dict(self._transport.peers)

    @property
    def members(self) -> list[str]:
        """Every member's id, this node included."""
        return sorted([self.node_id, *self._transport.peers])

    @property
    def majority(self) -> int:
        """How many members make a majority."""
        return (len(self._transport.peers) + 1) // 2 + 1

    @property
    def refused(self) -> dict[str, int]:
        """Connections and requests refused by this node's port, by reason."""
        return dict(self._transport.refused)

    def progress(self, peer_id: str) -> PeerProgress | None:
        """The leader's view of ``peer_id`` (None when not leading)."""
        return self._progress.get(peer_id) if self._role is Role.LEADER else None

    def status(self) -> dict[str, Any]:
        """JSON form of the node's state (for ``/health`` and tools)."""
        end, last_term = self.log.last()
        now = self._loop.time() if self._loop else 0.0
        peers = {peer: {"next_offset": p.next_offset, "match_offset": p.match_offset, "failures": p.failures,
                        "last_ack_age_s": round(now - p.last_ack, 3)} for peer, p in self._progress.items()}
        return {"group": self.group, "node": self.node_id, "role": self._role.value, "term": self.term,
                "voted_for": self.voted_for, "leader": self._leader_id, "commit_offset": self._commit,
                "log_end": end, "last_term": last_term, "running": self.running,
                "peers": peers if self._role is Role.LEADER else {}, "transfer_target": self._transfer_target,
                "refused": self.refused, "stats": dict(self.stats)}

    # -- listeners ------------------------------------------------------------------------------
    def add_commit_listener(self, listener: CommitListener) -> None:
        """Call ``listener(commit_offset)`` each time the commit offset advances (on the loop)."""
        self._commit_listeners.append(listener)

    def add_role_listener(self, listener: RoleListener) -> None:
        """Call ``listener(role, term, leader_id)`` each time one of them changes (on the loop)."""
        self._role_listeners.append(listener)

    def set_peer_address(self, peer_id: str, address: tuple[str, int]) -> None:
        """Dial ``peer_id`` at ``address`` from now on (it moved)."""
        self._transport.set_peer_address(peer_id, address)

    # -- proposing ------------------------------------------------------------------------------
    def propose(self, data: bytes) -> asyncio.Future[tuple[int, int]]:
        """Append ``data`` as one entry; a future of its ``(start, end)`` once committed on a majority.

        Raises :class:`NotLeaderError` at once on a node that does not lead (or is transferring its
        leadership).  The future fails with :class:`LeadershipLostError` when this node steps down
        first, :class:`ProposalTimeoutError` after ``wait_for_ack_s``; in both cases the entry may
        still commit later.  Example::

            start, end = await node.propose(b"records...")
        """
        if self._role is not Role.LEADER or self._stopped:
            raise NotLeaderError(self.group, self.node_id, self._leader_id, self._address_of(self._leader_id),
                                 " (stopped)" if self._stopped else "")
        if self._transfer_target is not None:
            raise NotLeaderError(self.group, self.node_id, self._transfer_target,
                                 self._address_of(self._transfer_target),
                                 f" (transferring leadership to {self._transfer_target})")
        if not data:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "a proposal cannot be empty")
        assert self._loop is not None
        start, end = self.log.append(self.term, data)
        proposal = _Proposal(start, end, self._loop.create_future())
        proposal.timer = self._loop.call_later(self.config.wait_for_ack_s, self._expire, proposal)
        self._proposals.append(proposal)
        self.stats["proposals"] += 1
        self._wake_replicators()
        self._advance_commit()  # a group of one commits at once
        return proposal.future

    @property
    def accepting_proposals(self) -> bool:
        """Whether :meth:`propose` (and a log's own appends, :meth:`log_grew`) would be accepted now."""
        return self._role is Role.LEADER and not self._stopped and self._transfer_target is None

    def log_grew(self) -> None:
        """The log appended entries of this leader's term by itself (a store's local appends): replicate them.

        On a node that does not lead (it stepped down since) this does nothing: those entries are an
        uncommitted tail that the next leader keeps or cuts.
        """
        if self._role is Role.LEADER and not self._stopped:
            self._wake_replicators()
            self._advance_commit()  # a group of one commits at once

    def _expire(self, proposal: _Proposal) -> None:
        if not proposal.future.done():
            self.stats["proposals_timed_out"] += 1
            proposal.future.set_exception(ProposalTimeoutError(
                f"entry {proposal.start}..{proposal.end} not committed within {self.config.wait_for_ack_s} s "
                f"(commit offset {self._commit})"))

    def _fail_proposals(self, error: ProposalFailedError) -> None:
        proposals, self._proposals = self._proposals, collections.deque()
        for proposal in proposals:
            if proposal.timer is not None:
                proposal.timer.cancel()
            if not proposal.future.done():
                proposal.future.set_exception(error)

    # -- elections ------------------------------------------------------------------------------
    def campaign(self, pre_vote: bool | None = None) -> None:
        """Start an election now (with a pre-vote first unless ``pre_vote`` is False or the config says so)."""
        if self._stopped or self._role is Role.LEADER:
            return
        if self.config.pre_vote if pre_vote is None else pre_vote:
            self._start_pre_vote()
        else:
            self._start_election()

    def _election_timeout(self) -> float:
        return self.config.leader_lost_s + self._rng.uniform(*self.config.election_jitter_s)

    def _retry_timeout(self) -> float:
        return self.config.heartbeat_interval_s + self._rng.uniform(*self.config.election_jitter_s)

    def _reset_election_timer(self, delay: float | None = None) -> None:
        self._cancel_election_timer()
        if self._stopped or self._role is Role.LEADER or self._loop is None:
            return
        delay = self._election_timeout() if delay is None else delay
        self._election_timer = self._loop.call_later(delay, self._on_election_timer)

    def _cancel_election_timer(self) -> None:
        if self._election_timer is not None:
            self._election_timer.cancel()
            self._election_timer = None

    def _on_election_timer(self) -> None:
        self._election_timer = None
        if self._role is not Role.LEADER and not self._stopped:
            log.info("%s/%s: no leader heard (%s, term %d): campaigning", self.group, self.node_id,
                     self._role.value, self.term)
            self.campaign()

    def _start_pre_vote(self) -> None:
        self._round += 1
        self._votes = {self.node_id}
        self._set_role(Role.PRE_CANDIDATE, None)
        self.stats["pre_votes"] += 1
        self._reset_election_timer(self._retry_timeout())
        if len(self._votes) >= self.majority:
            self._start_election()
            return
        self._ask_votes(pre_vote=True, transfer=False)

    def _start_election(self, transfer: bool = False) -> None:
        if self._stopped or self._role is Role.LEADER:
            return
        self._state.save(self.term + 1, self.node_id)  # the term and the self-vote count only once on disk
        self._round += 1
        self._votes = {self.node_id}
        self._set_role(Role.CANDIDATE, None)
        self.stats["elections"] += 1
        self._reset_election_timer(self._retry_timeout())
        if len(self._votes) >= self.majority:
            self._become_leader()
            return
        self._ask_votes(pre_vote=False, transfer=transfer)

    def _ask_votes(self, *, pre_vote: bool, transfer: bool) -> None:
        end, last_term = self.log.last()
        term = self.term + 1 if pre_vote else self.term
        for peer in self._transport.peers:
            request = VoteRequest(self.group, self.node_id, self._transport.next_rpc_id(), term, end, last_term,
                                  pre_vote, transfer)
            self._spawn(self._ask_vote(peer, request, self._round), self._tasks)

    async def _ask_vote(self, peer: str, request: VoteRequest, round_: int) -> None:
        try:
            reply = await self._transport.call(peer, request, self.config.rpc_timeout)
        except RpcError:
            return
        if self._stopped or not isinstance(reply, VoteReply):
            return
        if reply.term > self.term:
            self._adopt_term(reply.term)
            return
        if round_ != self._round or not reply.granted:
            return
        self._votes.add(peer)
        if len(self._votes) < self.majority:
            return
        if request.pre_vote and self._role is Role.PRE_CANDIDATE and request.term == self.term + 1:
            self._start_election()
        elif not request.pre_vote and self._role is Role.CANDIDATE and request.term == self.term:
            self._become_leader()

    def _in_lease(self) -> bool:
        """Whether a live leader is known: this node leads, or heard its leader within the leader-lost time."""
        if self._role is Role.LEADER:
            return True
        assert self._loop is not None
        return (self._role is Role.FOLLOWER and self._leader_id is not None
                and self._loop.time() - self._leader_seen_at < self.config.leader_lost_s)

    # -- role changes ---------------------------------------------------------------------------
    def _set_role(self, role: Role, leader_id: str | None) -> None:
        self._role = role
        self._leader_id = leader_id
        self._report_role()

    def _report_role(self) -> None:
        now = (self._role, self.term, self._leader_id)
        if now == self._reported:
            return
        self._reported = now
        log.info("%s/%s: %s in term %d, leader %s", self.group, self.node_id, self._role.value, self.term,
                 self._leader_id)
        for listener in list(self._role_listeners):
            try:
                listener(*now)
            except Exception:
                log.exception("%s/%s: role listener failed", self.group, self.node_id)
        self._notify()

    def _adopt_term(self, term: int, vote: str | None = None) -> None:
        """A higher term was seen: persist it (and a vote in it), then follow nobody yet."""
        self._state.save(term, vote)
        self._become_follower(None)

    def _become_follower(self, leader_id: str | None) -> None:
        was = self._role
        if was is Role.LEADER:
            self._end_leadership()
        if was is not Role.FOLLOWER:
            self._round += 1  # votes still on their way belong to a finished election
        self._set_role(Role.FOLLOWER, leader_id)
        if was is not Role.FOLLOWER or self._election_timer is None:
            self._reset_election_timer()

    def _end_leadership(self) -> None:
        log.info("%s/%s: stepping down in term %d", self.group, self.node_id, self.term)
        self.stats["step_downs"] += 1
        self._fail_proposals(LeadershipLostError(
            f"{self.node_id} stopped leading {self.group} in term {self.term} before the entry committed"))
        self._transfer_target = None
        current = asyncio.current_task()
        for task in list(self._leader_tasks):
            if task is not current:
                task.cancel()
        self._leader_tasks.clear()
        self._progress = {}
        self._shared_append = None

    def _become_leader(self) -> None:
        assert self._loop is not None
        self._cancel_election_timer()
        self._role = Role.LEADER
        self._leader_id = self.node_id
        now = self._loop.time()
        end = self.log.last()[0]
        # Every follower gets the leader-lost time to answer before check-quorum counts it as gone.
        self._leader_since = now
        self._progress = {peer: PeerProgress(next_offset=end) for peer in self._transport.peers}
        self.log.append(self.term, self._noop_entry(self.term))
        self.stats["terms_led"] += 1
        term = self.term
        for peer in self._progress:
            self._spawn(self._replicate(peer, term), self._tasks, self._leader_tasks)
        self._spawn(self._lead(term), self._tasks, self._leader_tasks)
        self._report_role()
        self._advance_commit()

    # -- replication: the leader's side ---------------------------------------------------------
    def _leads(self, term: int) -> bool:
        return self._role is Role.LEADER and self.term == term and not self._stopped

    def _wake_replicators(self) -> None:
        for peer in self._progress:
            self._pump(peer)

    def _pump(self, peer: str) -> None:
        """Send ``peer`` what it lacks now: entries up to :data:`PIPELINE_DEPTH` requests in flight, or a
        commit-only append when it has not been told the commit offset and nothing is in flight.

        Called in the very step that makes something to send (a local append, a reply, a commit), so an
        entry leaves for the followers without waiting for a task to be scheduled: on a busy loop every
        pass between an append and its replication is another batch's append time.
        """
        progress = self._progress.get(peer)
        if progress is None or not self._leads(self.term) or progress.retry_at:
            return
        assert self._loop is not None
        end = self.log.last()[0]
        term = self.term
        inflight = progress.inflight
        while (progress.next_offset < end and len(inflight) < PIPELINE_DEPTH) or (
                not inflight and progress.commit_sent < self._commit):
            self._send_append(peer, progress, term, end)

    def _send_append(self, peer: str, progress: PeerProgress, term: int, end: int) -> None:
        assert self._loop is not None
        # Followers in step get the same request in the same step: read, slice and encode it once for all.
        # (RPC ids are matched per connection, so one id serves every follower.)
        key = (term, progress.next_offset, end, self._commit)
        shared = self._shared_append
        if shared is not None and shared[0] == key:
            request, frame = shared[1], shared[2]
        else:
            request = self._append_request(progress, term, end)
            frame = frame_parts(request)
            self._shared_append = (key, request, frame) if request.prev_offset == key[1] else None
        progress.last_sent = self._loop.time()
        progress.commit_sent = request.commit
        progress.next_offset = request.prev_offset + sum(len(e.data) for e in request.entries)
        progress.inflight.append(request)
        self._transport.send(peer, request, self.config.rpc_timeout,
                             lambda reply, error: self._on_append_done(peer, progress, term, request, reply, error),
                             frame)

    def _on_append_done(self, peer: str, progress: PeerProgress, term: int, request: AppendRequest,
                        reply: Reply | None, error: RpcError | None) -> None:
        """A sent AppendEntries came back (or failed); then send what the outcome allows."""
        if self._progress.get(peer) is not progress or not self._leads(term) or request not in progress.inflight:
            return  # another term's, or already given up on with an earlier failure
        assert self._loop is not None
        if error is not None:
            progress.failures += 1
            log.debug("%s/%s: append to %s failed: %s", self.group, self.node_id, peer, error)
            # Everything in flight is moot (the connection was dropped): send again from the oldest unanswered.
            progress.next_offset = progress.inflight[0].prev_offset
            progress.inflight.clear()
            progress.retry_at = self._loop.time() + min(self.config.heartbeat_interval_s, self.config.rpc_timeout)
            progress.wake.set()
            return
        progress.inflight.remove(request)
        assert reply is not None
        self._on_append_reply(peer, request, reply, term)
        self._pump(peer)

    async def _replicate(self, peer: str, term: int) -> None:
        """Keep ``peer``'s log equal to the leader's: what :meth:`_pump` sends as soon as there is something,
        heartbeats when idle, and the back-off after a failed call.

        Up to :data:`PIPELINE_DEPTH` AppendEntries with entries are in flight at once (the follower
        answers them in order on one connection), so a batch does not wait a round trip for the one
        before it.  ``next_offset`` moves ahead when a request is sent; a failed call sends again from the
        oldest unanswered request after a pause, a refused one backs up (:meth:`_on_append_reply`).
        Safety does not depend on any of this: only a successful reply moves ``match_offset``.
        """
        assert self._loop is not None
        progress = self._progress[peer]
        heartbeat = self.config.heartbeat_interval_s
        self._pump(peer)
        while self._leads(term):
            now = self._loop.time()
            if progress.retry_at:
                if now < progress.retry_at:
                    await asyncio.sleep(progress.retry_at - now)
                    continue
                progress.retry_at = 0.0
                self._pump(peer)
            if not progress.inflight and now - progress.last_sent >= heartbeat:
                self._send_append(peer, progress, term, self.log.last()[0])
            progress.wake.clear()
            # With appends in flight their replies (or their failure, which sets wake) come first: no heartbeat
            # is due then, so wait a whole interval rather than spin on an overdue one.
            wait = heartbeat if progress.inflight else max(0.001, heartbeat - (now - progress.last_sent))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(progress.wake.wait(), wait)

    def _append_request(self, progress: PeerProgress, term: int, end: int) -> AppendRequest:
        prev = progress.next_offset
        prev_term = self.log.term_at(prev)
        if prev_term is None:  # never expected: next_offset is always a boundary of this log
            prev = progress.next_offset = self.log.entry_boundary(min(prev, end))
            prev_term = self.log.term_at(prev) or 0
        batch = self.log.entries_from(prev, self.config.max_append_bytes) if prev < end else []
        entries = [Entry(entry_term, data) for _, entry_term, data in batch]
        self.stats["appends_sent"] += 1
        if entries:
            self.stats["entries_sent"] += len(entries)
            self.stats["entry_bytes_sent"] += sum(len(e.data) for e in entries)
        return AppendRequest(self.group, self.node_id, self._transport.next_rpc_id(), term, prev, prev_term,
                             self._commit, entries)

    def _on_append_reply(self, peer: str, request: AppendRequest, reply: Reply, term: int) -> None:
        if reply.term > self.term and isinstance(reply, AppendReply):
            log.info("%s/%s: %s is in term %d (this node: %d)", self.group, self.node_id, peer, reply.term,
                     self.term)
            self._adopt_term(reply.term)
            return
        if not self._leads(term):
            return
        if not isinstance(reply, AppendReply):
            log.warning("%s/%s: %s answered an append with %r", self.group, self.node_id, peer, reply)
            return
        assert self._loop is not None
        progress = self._progress[peer]
        progress.last_ack = self._loop.time()
        expected = request.prev_offset + sum(len(e.data) for e in request.entries)
        if reply.success and reply.end == expected:
            if expected > progress.match_offset:
                progress.match_offset = expected
                self._advance_commit()
                self._notify()
            progress.next_offset = max(progress.next_offset, expected)  # later requests may be in flight
        else:
            # Back up: below where this request started, at or below the follower's hint, on a boundary.
            back_to = min(reply.end, request.prev_offset - 1)
            progress.next_offset = self.log.entry_boundary(back_to) if back_to > 0 else 0
            self.stats["append_backtracks"] += 1

    def _advance_commit(self) -> None:
        """Commit up to the highest offset a majority holds, if its entry is of this leader's term (§5.4.2)."""
        if self._role is not Role.LEADER:
            return
        held = sorted([self.log.last()[0], *(p.match_offset for p in self._progress.values())], reverse=True)
        offset = held[self.majority - 1]
        if offset > self._commit and self.log.term_at(offset) == self.term:
            self._set_commit(offset)

    def _set_commit(self, offset: int) -> None:
        self._commit = offset
        proposals = self._proposals
        while proposals and proposals[0].end <= offset:
            proposal = proposals.popleft()
            if proposal.timer is not None:
                proposal.timer.cancel()
            if not proposal.future.done():
                proposal.future.set_result((proposal.start, proposal.end))
        for listener in list(self._commit_listeners):
            try:
                listener(offset)
            except Exception:
                log.exception("%s/%s: commit listener failed", self.group, self.node_id)
        self._wake_replicators()  # followers learn the new commit offset without waiting for a heartbeat
        self._notify()

    async def _lead(self, term: int) -> None:
        """Once per heartbeat: check that a majority still answers, and hand over to the preferred leader."""
        assert self._loop is not None
        while self._leads(term):
            await asyncio.sleep(self.config.heartbeat_interval_s)
            if not self._leads(term):
                return
            now = self._loop.time()
            if self.config.check_quorum:
                lost = self.config.leader_lost_s
                heard = 1 + sum(1 for p in self._progress.values() if now - max(p.last_ack, self._leader_since) < lost)
                if heard < self.majority:
                    log.warning("%s/%s: only %d of %d members answered within %.3f s: stepping down",
                                self.group, self.node_id, heard, len(self.members), self.config.leader_lost_s)
                    self._become_follower(None)
                    return
            self._maybe_transfer_to_preferred(now)

    # -- leadership transfer --------------------------------------------------------------------
    def _maybe_transfer_to_preferred(self, now: float) -> None:
        preferred = self.config.preferred_leader
        if (preferred is None or preferred == self.node_id or self._transfer_target is not None
                or now < self._next_preferred_try):
            return
        progress = self._progress.get(preferred)
        if progress is None or now - progress.last_ack >= 2 * self.config.heartbeat_interval_s:
            return  # not healthy
        if self.log.last()[0] - progress.match_offset > self.config.max_append_bytes:
            return  # not caught up yet
        self._next_preferred_try = now + self.config.transfer_timeout
        self._spawn(self._transfer_quietly(preferred), self._tasks)

    async def _transfer_quietly(self, target: str) -> None:
        try:
            await self.transfer_leadership(target)
            log.info("%s/%s: handed leadership to the preferred leader %s", self.group, self.node_id, target)
        except (LeadershipTransferError, NotLeaderError) as exc:
            log.info("%s/%s: transfer to the preferred leader %s failed: %s", self.group, self.node_id, target, exc)

    async def transfer_leadership(self, to_id: str, timeout: float | None = None) -> None:
        """Make ``to_id`` the leader: bring it up to date (proposals are refused meanwhile), then TimeoutNow.

        Returns once this node follows ``to_id``; raises :class:`LeadershipTransferError` when that
        does not happen within ``timeout`` (default ``RaftConfig.transfer_timeout``), and
        :class:`NotLeaderError` when this node does not lead.  Example::

            await node.transfer_leadership("n2")
        """
        if to_id == self.node_id and self.is_leader:
            return
        if not self.is_leader:
            raise NotLeaderError(self.group, self.node_id, self._leader_id, self._address_of(self._leader_id))
        if to_id not in self._transport.peers:
            raise ValueError(f"{to_id!r} is not a member of {self.group!r}")
        if self._transfer_target is not None:
            raise LeadershipTransferError(f"a transfer to {self._transfer_target} is already under way")
        assert self._loop is not None
        term = self.term
        deadline = self._loop.time() + (timeout if timeout is not None else self.config.transfer_timeout)
        self._transfer_target = to_id
        self.stats["transfers"] += 1
        try:
            self._pump(to_id)
            caught_up = await self._wait_until(
                lambda: not self._leads(term) or self._progress[to_id].match_offset >= self.log.last()[0], deadline)
            if not self._leads(term):
                raise LeadershipTransferError(f"{self.node_id} lost the leadership during the transfer")
            if not caught_up:
                raise LeadershipTransferError(f"{to_id} did not catch up within the transfer timeout")
            request = TimeoutNowRequest(self.group, self.node_id, self._transport.next_rpc_id(), term)
            try:
                reply = await self._transport.call(to_id, request, self.config.rpc_timeout)
            except RpcError as exc:
                raise LeadershipTransferError(f"TimeoutNow to {to_id} failed: {exc}") from None
            if not (isinstance(reply, TimeoutNowReply) and reply.accepted):
                raise LeadershipTransferError(f"{to_id} refused to campaign: {reply!r}")
            if not await self._wait_until(lambda: self._leader_id == to_id and self.term > term, deadline):
                raise LeadershipTransferError(f"{to_id} did not become the leader in time "
                                              f"(leader {self._leader_id}, term {self.term})")
        finally:
            if self._transfer_target == to_id:
                self._transfer_target = None

    # -- requests from peers --------------------------------------------------------------------
    def _on_request(self, request: Request) -> Reply:
        if self._stopped:
            return Refusal(self.group, self.node_id, request.rpc_id, self.term, "stopped")
        if isinstance(request, AppendRequest):
            return self._on_append(request)
        if isinstance(request, VoteRequest):
            return self._on_vote(request)
        if isinstance(request, AclRequest):
            return self._on_acl(request)
        return self._on_timeout_now(request)

    # -- the ACL copy (not part of Raft: the leader's table, taken only from the current leader) ---------------
    @property
    def authenticated(self) -> bool:
        """Whether every connection between members proves the cluster secret (only then is the ACL copied)."""
        auth = self._transport.auth
        return auth is not None and auth.has_secret

    def push_acl(self, peer: str, table: bytes, on_done: Callable[[bool], None]) -> None:
        """Send this leader's ACL table (JSON) to ``peer``; ``on_done(accepted)`` once it answered (or not)."""
        request = AclRequest(self.group, self.node_id, self._transport.next_rpc_id(), self.term, table)

        def answered(reply: Reply | None, error: RpcError | None) -> None:
            on_done(isinstance(reply, AclReply) and reply.accepted)
        self._transport.send(peer, request, self.config.rpc_timeout, answered)

    def _on_acl(self, request: AclRequest) -> AclReply:
        accepted = (self.on_acl is not None and self.authenticated and self._role is not Role.LEADER
                    and request.term == self.term and request.sender == self._leader_id)
        if accepted:
            # Written to disk (fsync) on a worker thread: never on the loop that answers heartbeats.
            asyncio.get_running_loop().run_in_executor(None, self._apply_acl, request.table)
        return AclReply(self.group, self.node_id, request.rpc_id, self.term, accepted)

    def _apply_acl(self, table: bytes) -> None:
        try:
            assert self.on_acl is not None
            self.on_acl(table)
        except Exception:  # a table that does not parse or cannot be written: keep the one we have
            log.exception("%s/%s: the leader's ACL table could not be applied", self.group, self.node_id)

    def _vote_reply(self, request: VoteRequest, granted: bool) -> VoteReply:
        self.stats["votes_granted" if granted else "votes_refused"] += 1
        return VoteReply(self.group, self.node_id, request.rpc_id, self.term, granted)

    def _on_vote(self, request: VoteRequest) -> VoteReply:
        end, last_term = self.log.last()
        up_to_date = (request.last_term, request.last_offset) >= (last_term, end)
        if request.pre_vote:  # never changes anything here
            return self._vote_reply(request, request.term > self.term and up_to_date and not self._in_lease())
        if request.term < self.term:
            return self._vote_reply(request, False)
        if not request.transfer and self._in_lease():
            return self._vote_reply(request, False)  # a live leader is known: no term change, no vote
        if request.term > self.term:
            self._adopt_term(request.term, request.sender if up_to_date else None)
            granted = up_to_date
        else:
            granted = up_to_date and self.voted_for in (None, request.sender)
            if granted and self.voted_for is None:
                self._state.save(self.term, request.sender)  # on disk before the reply says so
        if granted:
            self._reset_election_timer()
        return self._vote_reply(request, granted)

    def _check_entries(self, request: AppendRequest) -> str | None:
        """Why ``request``'s entries cannot be a leader's (None when they can): checked before anything changes."""
        previous = request.prev_term
        if previous > request.term:
            return "prev_term above the leader's term"
        for entry in request.entries:
            if not entry.data:
                return "empty entry"
            if not previous <= entry.term <= request.term:
                return "entry terms out of order"
            previous = entry.term
        return None

    def _on_append(self, request: AppendRequest) -> Reply:
        problem = self._check_entries(request)
        if problem is not None:
            return Refusal(self.group, self.node_id, request.rpc_id, self.term, problem)
        self.stats["appends_received"] += 1
        if request.term < self.term:  # a deposed leader: tell it the term, change nothing
            return AppendReply(self.group, self.node_id, request.rpc_id, self.term, False, self.log.last()[0])
        if request.term == self.term and self._role is Role.LEADER:
            log.error("%s/%s: %s claims to lead term %d, which this node leads", self.group, self.node_id,
                      request.sender, request.term)
            return Refusal(self.group, self.node_id, request.rpc_id, self.term, "two leaders in one term")
        assert self._loop is not None
        if request.term > self.term:
            self._state.save(request.term, None)
        self._become_follower(request.sender)
        self._leader_seen_at = self._loop.time()
        self._reset_election_timer()
        if self.log.term_at(request.prev_offset) != request.prev_term:
            self.stats["appends_rejected"] += 1
            return AppendReply(self.group, self.node_id, request.rpc_id, self.term, False,
                               self._retry_hint(request.prev_offset))
        pos = request.prev_offset
        for entry in request.entries:
            end = pos + len(entry.data)
            if self.log.term_at(end) == entry.term:
                pos = end  # this very entry is here already (one entry of a term ends at a given offset)
                continue
            log_end = self.log.last()[0]
            if pos < log_end:
                if pos < self._commit:  # would drop a committed entry: impossible unless something is broken
                    log.critical("%s/%s: %s asks to overwrite committed log at %d (commit %d)", self.group,
                                 self.node_id, request.sender, pos, self._commit)
                    return Refusal(self.group, self.node_id, request.rpc_id, self.term, "overwrites committed log")
                self.log.truncate(pos)
                self.stats["truncations"] += 1
                self.stats["truncated_bytes"] += log_end - pos
                log.info("%s/%s: dropped the uncommitted tail %d..%d (leader %s, term %d)", self.group,
                         self.node_id, pos, log_end, request.sender, request.term)
            self.log.append_at(pos, entry.term, entry.data)
            self.stats["entries_received"] += 1
            pos = end
        if request.entries:
            self.stats["batches_received"] += 1
        commit = min(request.commit, pos)
        if commit > self._commit:
            self._set_commit(commit)
        return AppendReply(self.group, self.node_id, request.rpc_id, self.term, True, pos)

    def _retry_hint(self, prev_offset: int) -> int:
        """Where the leader should retry: this log's end, or the start of the conflicting term's entries."""
        end = self.log.last()[0]
        if prev_offset > end:
            return end
        hint = self.log.entry_boundary(prev_offset)
        if hint < prev_offset:
            return hint  # prev_offset falls inside one of this log's entries
        conflicting = self.log.term_at(hint)
        steps = 0
        # Everything up to the commit offset matches every leader's log: never walk below it.
        while hint > self._commit and self.log.term_at(hint) == conflicting and steps < _MAX_HINT_STEPS:
            hint = self.log.entry_boundary(hint - 1)
            steps += 1
        return hint

    def _on_timeout_now(self, request: TimeoutNowRequest) -> TimeoutNowReply:
        accepted = (request.term == self.term and self._role is Role.FOLLOWER
                    and request.sender == self._leader_id)
        if accepted:
            assert self._loop is not None
            term = self.term
            log.info("%s/%s: %s hands over leadership: campaigning now", self.group, self.node_id, request.sender)
            self._loop.call_soon(self._campaign_for_transfer, term)
        return TimeoutNowReply(self.group, self.node_id, request.rpc_id, self.term, accepted)

    def _campaign_for_transfer(self, term: int) -> None:
        if self.term == term and self._role is Role.FOLLOWER and not self._stopped:
            self._start_election(transfer=True)

    # -- helpers --------------------------------------------------------------------------------
    def _address_of(self, node_id: str | None) -> tuple[str, int] | None:
        if node_id is None:
            return None
        if node_id == self.node_id:
            return self.address
        return self._transport.peers.get(node_id)

    def _spawn(self, coro: Any, *groups: set[asyncio.Task[Any]]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        for group in groups:
            group.add(task)
            task.add_done_callback(group.discard)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s/%s: task failed", self.group, self.node_id, exc_info=task.exception())

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _wait_until(self, predicate: Callable[[], bool], deadline: float) -> bool:
        assert self._loop is not None
        while not predicate():
            remaining = deadline - self._loop.time()
            if remaining <= 0 or self._stopped:
                return predicate()
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return predicate()
        return True

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait (up to ``timeout`` s) until ``predicate()`` holds; re-checked whenever the node's state changes."""
        assert self._loop is not None
        return await self._wait_until(predicate, self._loop.time() + timeout)

    def __repr__(self) -> str:
        return (f"RaftNode({self.group}/{self.node_id}, {self._role.value}, term={self.term}, "
                f"leader={self._leader_id}, commit={self._commit}, end={self.log.last()[0]})")
