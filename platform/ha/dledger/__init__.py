"""DLedger groups (RocketMQ's DLedger): 3 or 5 brokers under one broker name whose commit log is a Raft log.

This package is the consensus core, written against an abstract log so the store can plug its commit
log in later:

* :mod:`.log` -- :class:`RaftLog`, what the core needs from a log positioned by byte offsets, and
  :class:`FileRaftLog`, a two-file implementation (tests, reference).
* :mod:`.state` -- :class:`RaftState`, the persisted current term and vote.
* :mod:`.messages` -- the RPC messages and their frames; :mod:`.transport` -- TCP between members.
* :mod:`.node` -- :class:`RaftNode`: elections (with pre-vote), replication, majority commit,
  proposals, leadership transfer and a preferred leader, all on one asyncio loop.

Log entries and positions
=========================
An entry is one batch of bytes (a leader's :meth:`RaftNode.propose` of a batch of records) of one
term, occupying ``[start, end)`` of the log; entries are contiguous, never empty, and their terms never
decrease along the log.  An entry is named by where it ends: ``term_at(end)``.  The empty prefix ends
at offset 0 with term 0.  A new leader appends a *no-op* entry of its term (:func:`default_noop_entry`,
replaceable by a store's own marker record) so that what earlier leaders left commits with it.

RPCs (:mod:`.messages`)
=======================
Frames are ``"RF" | version u8 | reserved u8 | length u32 LE | msgpack body``; the body is one tagged
msgspec struct, every one carrying ``group``, ``sender``, ``rpc_id``, ``term``:

* ``vote`` (``term``, ``last_offset``, ``last_term``, ``pre_vote``, ``transfer``) -> ``vote-reply`` (``granted``)
* ``append`` (``prev_offset``, ``prev_term``, ``commit``, ``entries: [[term, bytes], ...]``) ->
  ``append-reply`` (``success``, ``end``); no entries = heartbeat
* ``timeout-now`` -> ``timeout-now-reply`` (``accepted``): leadership transfer
* ``refused`` (``reason``): a request from another group or a non-member, or entries no leader could
  have sent; the connection closes.  Frames that do not decode close the connection unanswered.

Each node listens on its own port; it sends requests over the connection it opened to the peer and
reads the replies there.  Bad input is refused before the node's state is touched.

Safety argument
===============
*Election safety* (at most one leader per term): a node grants one vote per term, and the vote is on
disk (:class:`RaftState`, fsync'd rename) before the reply granting it is sent, so a restart cannot
vote again; a candidate's own vote and new term are on disk before it asks anyone.  A leader needs a
majority of votes in its term, and two majorities share a member.  Pre-votes change nothing (no term,
no vote), so they do not weaken this.  Terms only grow: a higher term seen in any request or reply is
persisted before it is acted on, and a node in a higher term refuses everything from a lower one.

*Log matching* (two logs with an entry of term T ending at offset e agree on everything up to e): a
leader makes at most one entry ending at a given offset in its term and never rewrites its log; a
follower appends after ``prev_offset`` only when its entry ending there has ``prev_term``, and drops
a conflicting tail before appending.  By induction both logs hold the same prefix.  An entry already
present (same term ending at the same offset) is kept, so a delayed, repeated AppendEntries never
truncates what a later one added.

*Leader completeness* (a committed entry is in every later leader's log): the leader commits an
offset only when a majority holds it *and* the entry ending there is of its current term (Raft
§5.4.2; earlier-term entries commit with it, hence the no-op).  A voter grants its vote only to a
candidate whose log is at least as up to date (last term, then last end offset), and any electing
majority contains a member holding the committed entry.  A follower never truncates below its commit
offset (it would refuse such a request as impossible).

*Acknowledgements*: a proposal's future resolves only when the commit offset passes its end, on the
leader that appended it, in that leader's term.  A leader that sees a higher term steps down in the
same synchronous step (persisting the term) and fails every waiting proposal with
:class:`LeadershipLostError` before any later reply could be counted; failed and timed-out proposals
are "unknown outcome" (the entry may still commit), never "not stored".  With ``check_quorum`` a
leader that has not heard from a majority for the leader-lost time steps down by itself.

*Liveness* helpers: randomized election timeouts (leader lost after ``max_missed_heartbeats``
heartbeats plus 300-1000 ms by default), pre-vote (a node cut off from the majority never raises its
term), a leader lease (a node that heard a live leader recently ignores vote requests, except those of
a leadership transfer), and fast back-off on log conflicts (the follower hints its end, or the start
of its conflicting term).

What is persisted when
======================
=========================  =====================  =============================================================
what                       where                  when
=========================  =====================  =============================================================
current term, voted for    ``raft-state.json``    before a vote is granted, before a candidate asks for votes,
                                                  before a higher term is adopted (temp file, fsync, rename, dir fsync)
log entries                the :class:`RaftLog`   before the follower's reply acknowledging them; on the leader
                                                  before they are sent (``FileRaftLog(fsync=True)``: on disk)
commit offset              memory only            re-learned from the leader after a restart (safe: it only grows)
peer progress, votes       memory only            rebuilt by each new leader / election
=========================  =====================  =============================================================
"""
from __future__ import annotations

from .log import EntryIndex, FileRaftLog, RaftLog
from .member import DLedgerMember
from .messages import MAX_FRAME_BYTES
from .node import (
    DEFAULT_ELECTION_JITTER_S,
    DEFAULT_HEARTBEAT_INTERVAL_S,
    DEFAULT_MAX_APPEND_BYTES,
    DEFAULT_MAX_MISSED_HEARTBEATS,
    DEFAULT_WAIT_FOR_ACK_S,
    LeadershipLostError,
    LeadershipTransferError,
    NotLeaderError,
    PeerProgress,
    ProposalFailedError,
    ProposalTimeoutError,
    RaftConfig,
    RaftNode,
    Role,
    default_noop_entry,
    is_noop_entry,
)
from .state import RaftState
from .store_log import CommitLogRaftLog
from .transport import RpcError

__all__ = [
    "DEFAULT_ELECTION_JITTER_S",
    "DEFAULT_HEARTBEAT_INTERVAL_S",
    "DEFAULT_MAX_APPEND_BYTES",
    "DEFAULT_MAX_MISSED_HEARTBEATS",
    "DEFAULT_WAIT_FOR_ACK_S",
    "MAX_FRAME_BYTES",
    "CommitLogRaftLog",
    "DLedgerMember",
    "EntryIndex",
    "FileRaftLog",
    "LeadershipLostError",
    "LeadershipTransferError",
    "NotLeaderError",
    "PeerProgress",
    "ProposalFailedError",
    "ProposalTimeoutError",
    "RaftConfig",
    "RaftLog",
    "RaftNode",
    "RaftState",
    "Role",
    "RpcError",
    "default_noop_entry",
    "is_noop_entry",
]
