"""The Raft core of DLedger groups (platform/ha/dledger): real sockets on 127.0.0.1, fast timings, one loop.

Nodes of a group run in this process on one uvloop loop (as they will on a broker's loop); links
between them go straight to each other's port, or through :mod:`tcp_proxy` proxies (one per directed
link) when a test partitions, pauses or cuts links.  A node is "killed" with ``RaftNode.stop()``: its
sockets are aborted and its tasks cancelled with no goodbye; it comes back as a new ``RaftNode`` over
the same files.  What counts as acknowledged is a ``propose()`` future that resolved.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import random
import signal
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import uvloop
from tcp_proxy import LinkMode, ProxyMesh

from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.ha.dledger import (
    FileRaftLog,
    LeadershipLostError,
    NotLeaderError,
    ProposalFailedError,
    ProposalTimeoutError,
    RaftConfig,
    RaftNode,
    RaftState,
    Role,
    is_noop_entry,
)
from sparkmq.platform.ha.dledger.log import INDEX_FILE, INDEX_RECORD
from sparkmq.platform.ha.dledger.messages import (
    FRAME_HEADER,
    FRAME_MAGIC,
    FRAME_VERSION,
    MAX_FRAME_BYTES,
    AppendReply,
    AppendRequest,
    Entry,
    Refusal,
    Reply,
    Request,
    VoteReply,
    VoteRequest,
    decode_reply,
    encode_frame,
)
from sparkmq.platform.ha.dledger.state import STATE_FILE

#: Test timings: 100 ms heartbeats, leader lost after 300 ms, elections 400-600 ms after the last beat.
FAST = RaftConfig(heartbeat_interval_s=0.1, max_missed_heartbeats=3, election_jitter_s=(0.1, 0.3),
                  rpc_timeout_s=0.3, wait_for_ack_s=1.0)
#: The longest a follower waits before campaigning.
ELECTION_MAX_S = FAST.leader_lost_s + FAST.election_jitter_s[1]
GROUP = "broker-a"
#: Length of the randomized (Jepsen-style) run; raise it for a longer soak.
JEPSEN_S = float(os.environ.get("SPARKMQ_RAFT_JEPSEN_S", "18"))


def run(coro: Awaitable[Any], timeout: float = 60.0) -> Any:
    """Run ``coro`` on a fresh uvloop loop (a broker runs its nodes on uvloop), bounded by ``timeout``."""
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(bounded())


async def eventually(predicate: Callable[[], bool], timeout: float, what: str, step: float = 0.01) -> float:
    """Poll until ``predicate()`` holds; how long it took.  AssertionError naming ``what`` after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(step)
    return time.monotonic() - start


def committed_entries(node: RaftNode) -> list[tuple[int, int, bytes]]:
    """The committed entries ``(start, term, data)`` of a node (its log is a FileRaftLog)."""
    commit = node.commit_index
    return node.log.entries_from(0, commit) if commit else []


def committed_bytes(node: RaftNode) -> bytes:
    return node.log.read(0, node.commit_index)  # type: ignore[attr-defined]


class Cluster:
    """A DLedger group of ``size`` nodes under ``root``, optionally with a proxy on every link."""

    def __init__(self, root: Path, size: int, config: RaftConfig = FAST, *, mesh: bool = False,
                 group: str = GROUP) -> None:
        self.root = root
        self.config = config
        self.group = group
        self.ids = [f"n{i}" for i in range(size)]
        self.nodes: dict[str, RaftNode] = {}
        self.ports: dict[str, int] = {}
        self.mesh = ProxyMesh(self.ids) if mesh else None
        #: (time, node, role, term, leader) of every role change of every node.
        self.history: list[tuple[float, str, Role, int, str | None]] = []
        #: (node, commit offset, term of the entry ending there, the node's term, its role) at each commit advance.
        self.commits: list[tuple[str, int, int | None, int, Role]] = []

    async def __aenter__(self) -> Cluster:
        if self.mesh is not None:
            await self.mesh.start()
        for node_id in self.ids:
            await self.start_node(node_id)
        if self.mesh is None:
            for node in self.nodes.values():
                for peer in self.ids:
                    if peer != node.node_id:
                        node.set_peer_address(peer, ("127.0.0.1", self.ports[peer]))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for node_id in self.ids:
            await self.kill(node_id)
        if self.mesh is not None:
            await self.mesh.close()

    def _peers(self, node_id: str) -> dict[str, tuple[str, int]]:
        if self.mesh is not None:
            return self.mesh.peers_for(node_id)
        # Port 1 (nobody listens) until the peer started; __aenter__ sets the real ones.
        return {p: ("127.0.0.1", self.ports.get(p, 1)) for p in self.ids if p != node_id}

    async def start_node(self, node_id: str, config: RaftConfig | None = None) -> RaftNode:
        """Start (or restart, over the same files and port) node ``node_id``."""
        directory = self.root / node_id
        port = self.ports.get(node_id, 0) if self.mesh is None else 0
        node = RaftNode(self.group, node_id, self._peers(node_id), FileRaftLog(directory, fsync=False),
                        RaftState(directory), config or self.config, port=port)
        node.add_role_listener(lambda role, term, leader, n=node_id: self.history.append(
            (time.monotonic(), n, role, term, leader)))
        node.add_commit_listener(lambda offset, n=node: self.commits.append(
            (n.node_id, offset, n.log.term_at(offset), n.term, n.role)))
        await node.start()
        self.nodes[node_id] = node
        self.ports[node_id] = node.address[1]
        if self.mesh is not None:
            self.mesh.set_target(node_id, node.address)
        return node

    async def kill(self, node_id: str) -> None:
        """Stop the node abruptly (no goodbye) and close its files."""
        node = self.nodes.get(node_id)
        if node is not None and node.running:
            await node.stop()
            node.log.close()  # type: ignore[attr-defined]

    def running(self) -> list[RaftNode]:
        return [n for n in self.nodes.values() if n.running]

    def leader(self, among: list[str] | None = None) -> RaftNode | None:
        """The running leader with the highest term (among ``among``)."""
        leaders = [n for n in self.running() if n.is_leader and (among is None or n.node_id in among)]
        return max(leaders, key=lambda n: n.term) if leaders else None

    async def wait_leader(self, timeout: float = 10 * ELECTION_MAX_S, among: list[str] | None = None,
                          settled: bool = True) -> RaftNode:
        """A leader (among ``among``) that every other running node of ``among`` follows when ``settled``."""
        group = among or self.ids

        def ok() -> bool:
            leader = self.leader(group)
            if leader is None:
                return False
            if not settled:
                return True
            return all(n.leader_id == leader.node_id and n.term == leader.term
                       for n in self.running() if n.node_id in group)

        await eventually(ok, timeout, f"a settled leader among {group}")
        leader = self.leader(group)
        assert leader is not None
        return leader

    async def wait_converged(self, timeout: float = 10.0, among: list[str] | None = None) -> None:
        """Every running node (of ``among``) holds the same log as the leader and the same commit offset."""
        group = among or self.ids

        def ok() -> bool:
            leader = self.leader(group)
            if leader is None:
                return False
            target = (leader.log.last(), leader.commit_index)
            return all((n.log.last(), n.commit_index) == target for n in self.running() if n.node_id in group)

        await eventually(ok, timeout, f"logs and commit offsets of {group} converged")

    def assert_leaders_commit_only_their_own_terms(self) -> None:
        """Raft §5.4.2: a leader moves its commit offset only to the end of an entry of its own term."""
        for node_id, offset, entry_term, node_term, role in self.commits:
            if role is Role.LEADER:
                assert entry_term == node_term, (
                    f"{node_id}, leading term {node_term}, committed up to an entry of term {entry_term} at {offset}")

    def leaders_by_term(self) -> dict[int, set[str]]:
        """Every node that was LEADER in a term, by term."""
        out: dict[int, set[str]] = {}
        for _, node_id, role, term, _ in self.history:
            if role is Role.LEADER:
                out.setdefault(term, set()).add(node_id)
        return out

    def assert_one_leader_per_term(self) -> None:
        for term, leaders in self.leaders_by_term().items():
            assert len(leaders) == 1, f"term {term} had leaders {sorted(leaders)}"

    def assert_logs_match(self) -> None:
        """Every running node's committed bytes are a prefix of the longest; committed offsets never lost."""
        nodes = self.running()
        longest = max(nodes, key=lambda n: n.commit_index)
        reference = committed_bytes(longest)
        for node in nodes:
            assert reference.startswith(committed_bytes(node)), f"{node.node_id} diverges from {longest.node_id}"
        final = longest.log
        for node_id, offset, term, _, _ in self.commits:
            if offset <= longest.commit_index:
                assert final.term_at(offset) == term, (
                    f"{node_id} committed an entry of term {term} ending at {offset}; "
                    f"the log now has term {final.term_at(offset)} there")


async def raw_rpc(address: tuple[str, int], payload: bytes, timeout: float = 2.0) -> Reply | None:
    """Send raw bytes to a node's port; its decoded reply, or None when it closed the connection unanswered."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(payload)
        await writer.drain()
        try:
            header = await asyncio.wait_for(reader.readexactly(FRAME_HEADER.size), timeout)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        magic, version, length = FRAME_HEADER.unpack(header)
        assert (magic, version) == (FRAME_MAGIC, FRAME_VERSION)
        return decode_reply(await reader.readexactly(length))
    finally:
        writer.transport.abort()


async def request(node: RaftNode, message: Request) -> Reply | None:
    return await raw_rpc(node.address, encode_frame(message))


def snapshot(node: RaftNode) -> tuple[Any, ...]:
    return (node.role, node.term, node.voted_for, node.leader_id, node.log.last(), node.commit_index)


# ---- the log and the persisted state ------------------------------------------------------------

def test_file_raft_log_contract_and_torn_tail(tmp_path: Path) -> None:
    log = FileRaftLog(tmp_path, fsync=True)
    assert log.last() == (0, 0) and log.term_at(0) == 0 and log.entries_from(0, 100) == []
    assert log.append(1, b"aaaa") == (0, 4)
    assert log.append(1, b"bb") == (4, 6)
    log.append_at(6, 3, b"cccccc")
    with pytest.raises(ValueError):
        log.append_at(5, 3, b"x")  # not at the end
    with pytest.raises(ValueError):
        log.append(2, b"x")  # terms never go back
    with pytest.raises(ValueError):
        log.append(3, b"")  # entries are never empty
    assert log.last() == (12, 3)
    assert [log.term_at(o) for o in (0, 3, 4, 5, 6, 12, 13)] == [0, None, 1, None, 1, 3, None]
    assert [log.entry_boundary(o) for o in (0, 3, 4, 5, 11, 12, 99)] == [0, 0, 4, 4, 6, 12, 12]
    assert log.entries_from(0, 6) == [(0, 1, b"aaaa"), (4, 1, b"bb")]
    assert log.entries_from(4, 1) == [(4, 1, b"bb")]  # at least one entry, however small max_bytes is
    assert log.entries_from(12, 10) == []
    with pytest.raises(ValueError):
        log.entries_from(5, 10)
    log.truncate(6)
    assert log.last() == (6, 1)
    with pytest.raises(ValueError):
        log.truncate(5)
    log.append(4, b"dddddddd")
    log.close()

    # Reopen: everything is there; then tear the tail in every way a crash can.
    log = FileRaftLog(tmp_path)
    assert log.entries(0) == [(0, 4, 1), (4, 6, 1), (6, 14, 4)] and log.recovered_cut_bytes == 0
    log.close()
    with open(tmp_path / "raft.data", "ab") as f:
        f.write(b"half an entry")  # data written, index record not yet
    with open(tmp_path / INDEX_FILE, "ab") as f:
        f.write(b"\x01" * (INDEX_RECORD.size // 2))  # a torn index record
    log = FileRaftLog(tmp_path)
    assert log.last() == (14, 4) and log.recovered_cut_bytes == len(b"half an entry")
    log.close()
    # A whole index record whose data is damaged (a machine crash without fsync): cut from that entry on.
    with open(tmp_path / "raft.data", "r+b") as f:
        f.seek(10)
        f.write(b"X")
    log = FileRaftLog(tmp_path)
    assert log.last() == (6, 1) and os.path.getsize(tmp_path / "raft.data") == 6
    assert os.path.getsize(tmp_path / INDEX_FILE) == 2 * INDEX_RECORD.size
    log.close()


_KILL9_CHILD = r"""
import sys
from sparkmq.platform.ha.dledger import FileRaftLog
log = FileRaftLog(sys.argv[1], fsync=False)
k = len(log)
while True:
    log.append(1 + k // 100, bytes([k % 251]) * (1 + (k * 7919) % 20000))
    k += 1
    if k % 300 == 0:
        print(k, flush=True)
"""


def test_file_raft_log_survives_kill9(tmp_path: Path) -> None:
    """A writer killed with SIGKILL mid-append, three times: every reopen holds a clean prefix and goes on."""
    counts = []
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", _KILL9_CHILD, str(tmp_path)], stdout=subprocess.PIPE)
        assert child.stdout is not None
        child.stdout.readline()  # it is appending
        time.sleep(0.1 + random.random() * 0.2)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        log = FileRaftLog(tmp_path, fsync=False)
        entries = log.entries(0)
        for k, (start, end, term) in enumerate(entries):
            assert term == 1 + k // 100
            assert log.read(start, end) == bytes([k % 251]) * (1 + (k * 7919) % 20000), f"entry {k} damaged"
        counts.append(len(entries))
        log.close()
    assert counts[0] >= 300 and counts[0] < counts[1] < counts[2]


def test_raft_state_persisted_atomically(tmp_path: Path) -> None:
    state = RaftState(tmp_path)
    assert (state.term, state.voted_for) == (0, None)
    state.save(3, "n1")
    assert not (tmp_path / (STATE_FILE + ".tmp")).exists()
    again = RaftState(tmp_path)
    assert (again.term, again.voted_for) == (3, "n1")
    with pytest.raises(ValueError):
        again.save(3, "n2")  # one vote per term
    with pytest.raises(ValueError):
        again.save(2, None)  # terms never go back
    again.save(3, "n1")
    again.save(4, None)
    assert (RaftState(tmp_path).term, RaftState(tmp_path).voted_for) == (4, None)
    (tmp_path / STATE_FILE).write_bytes(b'{"format": "sparkmq-raft-state", "ver')
    with pytest.raises(SparkMQError) as err:
        RaftState(tmp_path)
    assert err.value.code is ErrorCode.STORE_CORRUPT


def test_config_validates_eagerly() -> None:
    with pytest.raises(ValueError, match="heartbeat_interval_s"):
        RaftConfig(heartbeat_interval_s=0)
    with pytest.raises(ValueError, match="election_jitter_s"):
        RaftConfig(election_jitter_s=(1.0, 0.5))
    assert RaftConfig().leader_lost_s == 6.0 and RaftConfig().wait_for_ack_s == 2.5


# ---- elections, commit, failover ----------------------------------------------------------------

def test_three_nodes_elect_commit_fail_over_and_replace_an_uncommitted_tail(tmp_path: Path) -> None:
    async def main() -> None:
        async with Cluster(tmp_path, 3, mesh=True) as c:
            assert c.mesh is not None
            leader = await c.wait_leader()
            followers = [n for n in c.running() if n is not leader]

            # Proposals commit on a majority; every log is byte-identical up to the commit offset.
            acks = await asyncio.gather(*(leader.propose(f"first-{i}".encode()) for i in range(20)))
            assert len(set(acks)) == 20 and all(end > start for start, end in acks)
            assert leader.commit_index >= max(end for _, end in acks)
            await c.wait_converged()
            assert len({committed_bytes(n) for n in c.running()}) == 1

            # A follower refuses at once and names the leader.
            with pytest.raises(NotLeaderError) as err:
                followers[0].propose(b"nope")
            assert err.value.leader_id == leader.node_id and err.value.code is ErrorCode.SERVICE_NOT_AVAILABLE

            # Cut the leader off, then let it append a tail nobody else gets: it can never commit.
            old_id, old_term, committed = leader.node_id, leader.term, leader.commit_index
            committed_before = committed_bytes(leader)
            c.mesh.isolate(old_id)
            doomed = [leader.propose(f"doomed-{i}".encode()) for i in range(10)]
            assert leader.log.last()[0] > committed
            killed_at = time.monotonic()
            await c.kill(old_id)  # no goodbye
            for fut in doomed:
                with pytest.raises(ProposalFailedError):
                    await fut

            new = await c.wait_leader(timeout=5 * ELECTION_MAX_S, among=[f.node_id for f in followers])
            took = time.monotonic() - killed_at
            assert new.term > old_term and took < 5 * ELECTION_MAX_S
            # It holds everything committed before (leader completeness).
            assert new.log.read(0, committed) == committed_before
            later = await asyncio.gather(*(new.propose(f"second-{i}".encode()) for i in range(10)))

            # The old leader rejoins: its uncommitted tail is dropped and replaced by the new leader's log.
            c.mesh.heal()
            rejoined = await c.start_node(old_id)
            await c.wait_converged()
            assert rejoined.role is Role.FOLLOWER and rejoined.leader_id == new.node_id
            assert rejoined.stats["truncations"] >= 1 and rejoined.stats["truncated_bytes"] > 0
            data = [d for _, _, d in committed_entries(rejoined)]
            assert not any(d.startswith(b"doomed-") for d in data)
            assert [d for d in data if d.startswith((b"first-", b"second-"))] == \
                [f"first-{i}".encode() for i in range(20)] + [f"second-{i}".encode() for i in range(10)]
            assert max(end for _, end in later) <= rejoined.commit_index
            assert len({committed_bytes(n) for n in c.running()}) == 1
            c.assert_one_leader_per_term()
            c.assert_logs_match()

    run(main())


def test_follower_appends_truncates_commits_and_votes_by_the_rules(tmp_path: Path) -> None:
    """One node driven by hand-made RPCs from its two (absent) peers: every follower rule, deterministically."""
    async def main() -> None:
        peers = {"n1": ("127.0.0.1", 1), "n2": ("127.0.0.1", 1)}
        node = await RaftNode(GROUP, "n0", peers, FileRaftLog(tmp_path, fsync=False), RaftState(tmp_path),
                              FAST).start()
        rpc_ids = itertools.count(1)

        async def append(sender: str, term: int, prev: int, prev_term: int, entries: list[Entry],
                         commit: int = 0) -> Any:
            return await request(node, AppendRequest(GROUP, sender, next(rpc_ids), term, prev, prev_term, commit,
                                                     entries))

        async def vote(sender: str, term: int, last_offset: int, last_term: int, pre: bool = False) -> Any:
            reply = await request(node, VoteRequest(GROUP, sender, next(rpc_ids), term, last_offset, last_term, pre))
            assert isinstance(reply, VoteReply)
            return reply

        a, b, c = Entry(1, b"a" * 10), Entry(1, b"b" * 10), Entry(2, b"c" * 25)
        try:
            # n1 leads term 1 and sends A, B.
            r = await append("n1", 1, 0, 0, [a, b])
            assert isinstance(r, AppendReply) and r.success and r.end == 20 and node.log.last() == (20, 1)
            assert (node.leader_id, node.term, node.commit_index) == ("n1", 1, 0)
            # A late duplicate of an earlier append (just A) must not drop B, which came after it.
            r = await append("n1", 1, 0, 0, [a])
            assert r.success and r.end == 10 and node.log.last() == (20, 1), "a stale append truncated the log"
            # A gap: refused, with the follower's end as the place to retry.
            r = await append("n1", 1, 50, 1, [])
            assert not r.success and r.end == 20
            # n2 leads term 2 with log A, C; a small first batch (just A) says commit 35.  The follower may
            # commit only what it verified against the leader (A), not its own unverified B.
            r = await append("n2", 2, 0, 0, [a], commit=35)
            assert r.success and r.end == 10 and (node.term, node.leader_id) == (2, "n2")
            assert node.commit_index == 10, "committed beyond what matched the leader"
            # C conflicts with B (same start, another term): B goes, C comes, and now 35 is committed.
            r = await append("n2", 2, 10, 1, [c], commit=35)
            assert r.success and r.end == 35 and node.log.last() == (35, 2) and node.commit_index == 35
            assert node.stats["truncations"] == 1 and node.log.read(10, 35) == c.data
            # Overwriting committed entries is refused, and changes nothing.
            r = await append("n2", 2, 0, 0, [Entry(2, b"x" * 7)])
            assert isinstance(r, Refusal) and node.log.last() == (35, 2) and node.commit_index == 35
            # The deposed n1 (term 1): told the term, nothing changes.
            r = await append("n1", 1, 20, 1, [], commit=20)
            assert isinstance(r, AppendReply) and not r.success and r.term == 2 and node.log.last() == (35, 2)
            # The lease: n2 was heard just now, so a vote for term 3, even with a better log, is refused
            # without taking the term.
            assert not (await vote("n1", 3, 1000, 2)).granted and node.term == 2
            await asyncio.sleep(FAST.leader_lost_s + 0.05)
            # Leader lost.  Pre-votes compare logs and change nothing.
            assert not (await vote("n1", 3, 20, 1, pre=True)).granted
            assert (await vote("n1", 3, 35, 2, pre=True)).granted and node.term == 2
            # A candidate whose log is behind (older last term, or same term but shorter) gets no vote,
            # though its higher term is taken.
            assert not (await vote("n1", 3, 1000, 1)).granted and (node.term, node.voted_for) == (3, None)
            assert not (await vote("n1", 3, 30, 2)).granted and node.voted_for is None
            assert (await vote("n2", 3, 35, 2)).granted and node.voted_for == "n2"
            assert not (await vote("n1", 3, 99, 2)).granted, "two votes in one term"
        finally:
            await node.stop()
            node.log.close()  # type: ignore[attr-defined]

    run(main())


def test_a_new_leader_commits_older_entries_only_through_one_of_its_own(tmp_path: Path) -> None:
    """Raft §5.4.2 (the Figure 8 rule): an older term's entries held by a majority are not committed by
    counting replicas; the new leader's own no-op commits them.  One entry per AppendEntries here, so every
    step of the catch-up is seen by the commit listener."""
    config = dataclasses.replace(FAST, max_append_bytes=64)

    async def main() -> None:
        async with Cluster(tmp_path, 3, config) as c:
            leader = await c.wait_leader()
            for i in range(2):
                await leader.propose(f"committed-{i}".encode())
            await c.wait_converged()
            old_id, old_term = leader.node_id, leader.term
            f1, f2 = (n.node_id for n in c.running() if n is not leader)
            await c.kill(f1)
            await c.kill(f2)
            pending = [leader.propose(f"older-term-{i}:".encode().ljust(50, b".")) for i in range(5)]
            await c.kill(old_id)
            for fut in pending:
                with pytest.raises(LeadershipLostError):
                    await fut
            # The old leader and one follower come back: only the old leader's (longer) log can win.
            await c.start_node(old_id)
            back = await c.start_node(f1)
            new = await c.wait_leader(among=[old_id, f1])
            assert new.node_id == old_id and new.term > old_term
            # Converged logs can still share the old commit offset (the leader commits its no-op once the
            # follower's ack arrives, the follower learns it with the next append): wait for the no-op's commit.
            await eventually(lambda: new.commit_index == new.log.last()[0] == back.commit_index, 10.0,
                             "the new leader's no-op committed on both")
            await c.wait_converged(among=[old_id, f1])
            assert back.stats["batches_received"] >= 6  # five older entries and the no-op, one at a time
            c.assert_leaders_commit_only_their_own_terms()
            data = [d for _, _, d in committed_entries(back)]
            assert sum(d.startswith(b"older-term-") for d in data) == 5  # committed now, with the no-op
            await c.start_node(f2)
            await c.wait_converged()
            c.assert_logs_match()

    run(main())


def test_split_votes_resolve(tmp_path: Path) -> None:
    """Four nodes campaign in the same instant: term 1 has no winner, randomized retries elect one leader."""
    async def main() -> None:
        async with Cluster(tmp_path, 4) as c:
            for node in c.running():
                node.campaign(pre_vote=False)
            assert all(n.role is Role.CANDIDATE and n.term == 1 and n.voted_for == n.node_id for n in c.running())
            leader = await c.wait_leader()
            assert leader.term >= 2
            assert 1 not in c.leaders_by_term(), "a split term-1 vote must not elect anyone"
            c.assert_one_leader_per_term()
            await leader.propose(b"after the split")

    run(main())


def test_partitioned_old_leader_cannot_commit_and_steps_down_on_heal(tmp_path: Path) -> None:
    """Five nodes; the leader and one follower are cut from the other three.  check_quorum is off here, so
    the old leader keeps believing it leads: it must still commit nothing, and yield once it sees the term."""
    config = dataclasses.replace(FAST, check_quorum=False)

    async def main() -> None:
        async with Cluster(tmp_path, 5, config, mesh=True) as c:
            assert c.mesh is not None
            old = await c.wait_leader()
            acked = {f"before-{i}".encode(): await old.propose(f"before-{i}".encode()) for i in range(5)}
            await c.wait_converged()
            buddy = next(n for n in c.running() if n is not old)
            minority = [old.node_id, buddy.node_id]
            majority = [n for n in c.ids if n not in minority]
            c.mesh.partition(minority, majority)
            commit_before = old.commit_index

            stale = [old.propose(f"stale-{i}".encode()) for i in range(5)]
            new = await c.wait_leader(among=majority)
            assert new.term > old.term
            for i in range(5):
                acked[f"after-{i}".encode()] = await new.propose(f"after-{i}".encode())
            for fut in stale:
                with pytest.raises(ProposalTimeoutError):
                    await fut  # never acknowledged
            assert old.is_leader and old.commit_index == commit_before, "a minority leader committed something"
            assert buddy.term == old.term < new.term  # pre-vote: the minority side did not inflate its term

            # Half a heal: the old leader's requests reach the majority again, but nothing of theirs reaches it.
            # Only the replies to its own appends can tell it the new term: it must step down on them.
            for node_id in majority:
                c.mesh.proxy(old.node_id, node_id).heal()
            await eventually(lambda: old.role is Role.FOLLOWER and old.term == new.term, 5.0,
                             "the old leader stepped down on a reply carrying the new term")
            assert old.leader_id is None  # it heard no one yet: the term came from a reply
            c.mesh.heal()
            await c.wait_converged()
            assert old.stats["step_downs"] >= 1
            assert new.is_leader and c.leader() is new
            for node in c.running():
                data = [d for _, _, d in committed_entries(node)]
                assert not any(d.startswith(b"stale-") for d in data)
                for value, (start, end) in acked.items():
                    assert end <= node.commit_index and node.log.read(start, end) == value
            c.assert_one_leader_per_term()
            c.assert_logs_match()

    run(main())


def test_prevote_isolated_nodes_keep_their_term_and_an_isolated_leader_steps_down(tmp_path: Path) -> None:
    async def main() -> None:
        async with Cluster(tmp_path, 3, mesh=True) as c:
            assert c.mesh is not None
            leader = await c.wait_leader()
            await leader.propose(b"x")
            term = leader.term
            follower = next(n for n in c.running() if n is not leader)
            # The follower may have campaigned in the first election too (it lost term 1): count from here.
            pre_votes, elections = follower.stats["pre_votes"], follower.stats["elections"]

            c.mesh.isolate(follower.node_id)
            await asyncio.sleep(4 * ELECTION_MAX_S)
            assert follower.stats["pre_votes"] - pre_votes >= 3, "the isolated follower never tried"
            assert follower.term == term, "an isolated node raised its term"
            assert follower.stats["elections"] == elections, "an isolated node started an election"
            c.mesh.heal()
            await asyncio.sleep(3 * ELECTION_MAX_S)
            assert leader.is_leader and leader.term == term, "a rejoining node disrupted a healthy leader"

            # An isolated leader (check_quorum on) steps down by itself and does not raise its term either.
            c.mesh.isolate(leader.node_id)
            await eventually(lambda: leader.role is not Role.LEADER, 3 * ELECTION_MAX_S, "isolated leader stepped down")
            others = [n.node_id for n in c.running() if n is not leader]
            new = await c.wait_leader(among=others)
            await asyncio.sleep(3 * ELECTION_MAX_S)
            assert leader.term == term < new.term  # the isolated one stayed; the majority moved on
            c.mesh.heal()
            await eventually(lambda: leader.leader_id == new.node_id and leader.term == new.term, 5.0,
                             "the old leader follows the new one")
            c.assert_one_leader_per_term()

    run(main())


@pytest.mark.parametrize("pre_vote", [True, False])
def test_isolated_node_raises_its_term_only_without_prevote(tmp_path: Path, pre_vote: bool) -> None:
    """The control for the pre-vote test: the same isolated node without pre-vote inflates its term."""
    async def main() -> None:
        peers = {"n1": ("127.0.0.1", 1), "n2": ("127.0.0.1", 1)}  # nobody listens: cut off from everyone
        node = RaftNode(GROUP, "n0", peers, FileRaftLog(tmp_path, fsync=False), RaftState(tmp_path),
                        dataclasses.replace(FAST, pre_vote=pre_vote))
        await node.start()
        try:
            await asyncio.sleep(4 * ELECTION_MAX_S)
        finally:
            await node.stop()
        if pre_vote:
            assert node.term == 0 and node.stats["pre_votes"] >= 3
        else:
            assert node.term >= 3

    run(main())


def test_vote_and_term_survive_restart_and_no_second_vote_in_a_term(tmp_path: Path) -> None:
    async def main() -> None:
        peers = {"n1": ("127.0.0.1", 1), "n2": ("127.0.0.1", 1)}

        async def started() -> RaftNode:
            return await RaftNode(GROUP, "n0", peers, FileRaftLog(tmp_path, fsync=False), RaftState(tmp_path),
                                  FAST).start()

        def vote(sender: str, term: int, pre: bool = False) -> VoteRequest:
            return VoteRequest(GROUP, sender, 1, term, 0, 0, pre_vote=pre)

        node = await started()
        reply = await request(node, vote("n1", 5))
        assert isinstance(reply, VoteReply) and reply.granted and reply.term == 5
        on_disk = RaftState(tmp_path)  # the vote was on disk before the reply left
        assert (on_disk.term, on_disk.voted_for) == (5, "n1")
        await node.stop()
        node.log.close()  # type: ignore[attr-defined]

        node = await started()
        try:
            assert (node.term, node.voted_for) == (5, "n1")
            reply = await request(node, vote("n2", 5))
            assert isinstance(reply, VoteReply) and not reply.granted, "voted twice in term 5"
            reply = await request(node, vote("n1", 5))
            assert isinstance(reply, VoteReply) and reply.granted  # the same vote again is fine
            reply = await request(node, vote("n2", 7, pre=True))
            assert isinstance(reply, VoteReply) and reply.granted and node.term == 5  # a pre-vote changes nothing
            reply = await request(node, vote("n2", 6))
            assert isinstance(reply, VoteReply) and reply.granted and (node.term, node.voted_for) == (6, "n2")
            on_disk = RaftState(tmp_path)
            assert (on_disk.term, on_disk.voted_for) == (6, "n2")
            # A heartbeat of term 8 from n1: the term is on disk before the reply; then a vote in that term.
            reply = await request(node, AppendRequest(GROUP, "n1", 2, 8, 0, 0, 0))
            assert isinstance(reply, AppendReply) and reply.success and RaftState(tmp_path).term == 8
            await asyncio.sleep(FAST.leader_lost_s + 0.05)  # n1's lease runs out
            reply = await request(node, vote("n2", 8))
            assert isinstance(reply, VoteReply) and reply.granted
            on_disk = RaftState(tmp_path)
            assert (on_disk.term, on_disk.voted_for) == (8, "n2")
        finally:
            await node.stop()
            node.log.close()  # type: ignore[attr-defined]

    run(main())


# ---- catch-up and leadership transfer -----------------------------------------------------------

def test_far_behind_follower_catches_up_in_batches(tmp_path: Path) -> None:
    config = dataclasses.replace(FAST, max_append_bytes=256 * 1024, wait_for_ack_s=3.0)
    entry_bytes, entries = 100 * 1024, 160  # 16 MB behind

    async def main() -> None:
        async with Cluster(tmp_path, 3, config) as c:
            leader = await c.wait_leader()
            await leader.propose(b"early")
            await c.wait_converged()
            lagger = next(n for n in c.running() if n is not leader).node_id
            await c.kill(lagger)
            rng = random.Random(7)
            for _ in range(entries // 16):
                await asyncio.gather(*(leader.propose(rng.randbytes(entry_bytes)) for _i in range(16)))
            assert leader.commit_index > entries * entry_bytes

            started = time.monotonic()
            node = await c.start_node(lagger)
            await c.wait_converged(timeout=30.0)
            took = time.monotonic() - started
            assert node.log.read(0, node.commit_index) == leader.log.read(0, leader.commit_index)
            received, batches = node.stats["entries_received"], node.stats["batches_received"]
            assert received >= entries
            # Batches of at most 256 KiB: at most two 100 KiB entries per AppendEntries.
            assert batches >= received // 2
            print(f"caught up {entries * entry_bytes >> 20} MiB in {took:.2f} s ({batches} batches)")

    run(main())


def test_leadership_transfer_and_preferred_leader(tmp_path: Path) -> None:
    async def main() -> None:
        async with Cluster(tmp_path / "transfer", 3) as c:
            leader = await c.wait_leader()
            await asyncio.gather(*(leader.propose(f"e{i}".encode()) for i in range(10)))
            target = next(n for n in c.running() if n is not leader)
            started = time.monotonic()
            transfer = asyncio.ensure_future(leader.transfer_leadership(target.node_id))
            await asyncio.sleep(0)
            with pytest.raises(NotLeaderError):
                leader.propose(b"during the transfer")  # refused while the target catches up
            await transfer
            took = time.monotonic() - started
            assert target.is_leader and leader.leader_id == target.node_id and leader.role is Role.FOLLOWER
            assert took < 3 * FAST.heartbeat_interval_s, f"transfer took {took:.3f} s"
            print(f"leadership transfer took {took * 1000:.1f} ms")
            await target.propose(b"led by the target")
            c.assert_one_leader_per_term()

        preferred = dataclasses.replace(FAST, preferred_leader="n2")
        async with Cluster(tmp_path / "preferred", 3, preferred) as c:
            await eventually(lambda: c.leader() is c.nodes["n2"], 10 * ELECTION_MAX_S, "n2 leads")
            await c.kill("n2")
            other = await c.wait_leader(among=["n0", "n1"])
            await other.propose(b"while n2 is away")
            await c.start_node("n2")
            await eventually(lambda: c.leader() is c.nodes["n2"], 10 * ELECTION_MAX_S, "n2 leads again")
            await c.wait_converged()
            c.assert_one_leader_per_term()

    run(main())


# ---- bad input --------------------------------------------------------------------------------

def test_garbage_foreign_and_stale_messages_are_refused_and_change_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with Cluster(tmp_path, 3) as c:
            leader = await c.wait_leader()
            await asyncio.gather(*(leader.propose(f"v{i}".encode()) for i in range(5)))
            await c.wait_converged()
            follower = next(n for n in c.running() if n is not leader)
            before = {n.node_id: snapshot(n) for n in c.running()}
            term, end = follower.term, follower.log.last()[0]

            garbage = [
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                random.Random(1).randbytes(4096),
                FRAME_HEADER.pack(FRAME_MAGIC, FRAME_VERSION, MAX_FRAME_BYTES + 1),
                FRAME_HEADER.pack(FRAME_MAGIC, 99, 4) + b"abcd",
                FRAME_HEADER.pack(FRAME_MAGIC, FRAME_VERSION, 5) + b"\xc1\xc1\xc1\xc1\xc1",
                encode_frame(VoteReply(GROUP, leader.node_id, 1, 99, True)),  # a reply is not a request
            ]
            # Well-formed msgpack with an out-of-range field (a negative term): refused at decode.
            body = msgspec.msgpack.encode({"type": "append", "group": GROUP, "sender": leader.node_id, "rpc_id": 1,
                                           "term": -1, "prev_offset": 0, "prev_term": 0, "commit": 0})
            garbage.append(FRAME_HEADER.pack(FRAME_MAGIC, FRAME_VERSION, len(body)) + body)
            rng = random.Random(2)
            for _ in range(50):
                blob = rng.randbytes(rng.randrange(1, 300))
                garbage.append(FRAME_HEADER.pack(FRAME_MAGIC, FRAME_VERSION, len(blob)) + blob)
            for payload in garbage:
                assert await raw_rpc(follower.address, payload) is None

            refusals = [
                AppendRequest("broker-b", leader.node_id, 1, term + 5, end, 0, end),  # another group
                AppendRequest(GROUP, "intruder", 1, term + 5, end, 0, end),  # not a member
                AppendRequest(GROUP, leader.node_id, 1, term + 5, end, follower.log.last()[1], end,
                              [Entry(term + 6, b"from the future")]),  # entry term above the leader's
                AppendRequest(GROUP, leader.node_id, 1, term + 5, end, follower.log.last()[1], end,
                              [Entry(term + 5, b"")]),  # empty entry
                VoteRequest("broker-b", leader.node_id, 1, term + 5, 1 << 40, term + 4),
            ]
            for message in refusals:
                reply = await request(follower, message)
                assert isinstance(reply, Refusal), message

            # A deposed leader's (stale term) append and vote: answered "no" with the current term.  And a vote
            # for a higher term with a better log while the leader is alive (the lease): no vote, no new term.
            other = next(n for n in c.running() if n is not leader and n is not follower)
            stale = [AppendRequest(GROUP, leader.node_id, 1, term - 1, 0, 0, 1 << 40, [Entry(term - 1, b"old")]),
                     VoteRequest(GROUP, leader.node_id, 1, term - 1, 1 << 40, term - 1),
                     VoteRequest(GROUP, other.node_id, 1, term + 1, 1 << 40, term)]
            for message in stale:
                reply = await request(follower, message)
                assert isinstance(reply, AppendReply | VoteReply) and reply.term == term
                assert not (reply.success if isinstance(reply, AppendReply) else reply.granted)

            assert {n.node_id: snapshot(n) for n in c.running()} == before
            assert sum(follower.refused.values()) >= len(garbage) + len(refusals)
            assert follower.refused.get("wrong group", 0) >= 2 and follower.refused.get("not a member", 0) >= 1
            await leader.propose(b"still works")
            await c.wait_converged()

    run(main())


# ---- Jepsen-style: concurrent proposers against a nemesis ----------------------------------------

def test_randomized_nemesis_loses_no_acknowledged_proposal(tmp_path: Path) -> None:
    """Five nodes, four proposers, and a nemesis that kills leaders, pauses nodes, partitions and cuts links.

    After healing and a quiet period: every acknowledged proposal is in every node's committed log
    exactly once and at the offsets it was acknowledged with, the committed logs are identical, no
    offset a node ever reported committed changed its entry, and no term had two leaders.
    """
    config = dataclasses.replace(FAST, max_append_bytes=64 * 1024)
    rng = random.Random(int(os.environ.get("SPARKMQ_RAFT_SEED", "0")) or None)

    async def main() -> None:
        async with Cluster(tmp_path, 5, config, mesh=True) as c:
            assert c.mesh is not None
            mesh = c.mesh
            await c.wait_leader()
            acked: list[tuple[bytes, int, int]] = []
            failed: list[bytes] = []
            stop = asyncio.Event()
            events: list[str] = []

            async def proposer(pid: int) -> None:
                target = c.ids[pid % len(c.ids)]
                seq = 0
                while not stop.is_set():
                    node = c.nodes[target]
                    if not node.running:
                        target = rng.choice(c.ids)
                        await asyncio.sleep(0.02)
                        continue
                    seq += 1
                    value = f"p{pid}-{seq}:".encode() + b"." * rng.randrange(0, 200)
                    try:
                        fut = node.propose(value)
                    except NotLeaderError as exc:
                        target = exc.leader_id if exc.leader_id else rng.choice(c.ids)
                        await asyncio.sleep(0.005 if exc.leader_id else 0.05)
                        continue
                    try:
                        start, end = await fut
                        acked.append((value, start, end))
                    except ProposalFailedError:
                        failed.append(value)

            async def nemesis() -> None:
                while not stop.is_set():
                    await asyncio.sleep(rng.uniform(0.05, 0.5))
                    action = rng.choice(["kill-leader", "kill-any", "pause", "partition", "cut", "partition-hold"])
                    events.append(action)
                    if action.startswith("kill"):
                        leader = c.leader()
                        victim = leader.node_id if action == "kill-leader" and leader else rng.choice(c.ids)
                        await c.kill(victim)
                        await asyncio.sleep(rng.uniform(0.1, 1.2))
                        await c.start_node(victim)
                    elif action == "pause":
                        victim = rng.choice(c.ids)
                        mesh.isolate(victim, LinkMode.HOLD)  # its messages arrive late, all at once
                        await asyncio.sleep(rng.uniform(0.2, 1.2))
                        for proxy in mesh.links([victim], c.ids):
                            proxy.heal()
                    elif action.startswith("partition"):
                        ids = c.ids[:]
                        rng.shuffle(ids)
                        side = ids[:rng.choice([1, 2])]
                        mode = LinkMode.HOLD if action == "partition-hold" else LinkMode.DROP
                        mesh.partition(side, ids[len(side):], mode)
                        await asyncio.sleep(rng.uniform(0.2, 1.2))
                        mesh.heal()
                    else:
                        for _ in range(rng.randrange(1, 4)):
                            a, b = rng.sample(c.ids, 2)
                            mesh.cut([a], [b])

            tasks = [asyncio.ensure_future(proposer(i)) for i in range(4)]
            nemesis_task = asyncio.ensure_future(nemesis())
            await asyncio.sleep(JEPSEN_S)
            stop.set()
            await nemesis_task
            await asyncio.gather(*tasks)

            # Heal everything, bring every node back, and let the group settle.
            mesh.heal()
            for node_id in c.ids:
                if not c.nodes[node_id].running:
                    await c.start_node(node_id)
            barrier = None
            deadline = time.monotonic() + 20
            while barrier is None:
                assert time.monotonic() < deadline, "no leader committed the barrier after healing"
                leader = await c.wait_leader(timeout=20)
                try:
                    barrier = await leader.propose(b"barrier")
                except (NotLeaderError, ProposalFailedError):
                    await asyncio.sleep(0.05)
            await c.wait_converged(timeout=20)

            c.assert_one_leader_per_term()
            c.assert_leaders_commit_only_their_own_terms()
            c.assert_logs_match()
            logs = {committed_bytes(n) for n in c.running()}
            assert len(logs) == 1, "committed logs differ after the quiet period"
            assert len({n.commit_index for n in c.running()}) == 1
            reference = c.running()[0]
            data = [d for _, _, d in committed_entries(reference) if not is_noop_entry(d)]
            seen: dict[bytes, int] = {}
            for d in data:
                seen[d] = seen.get(d, 0) + 1
            assert all(count == 1 for count in seen.values()), "an entry is in the log twice"
            for value, start, end in acked:
                assert seen.get(value) == 1, f"acknowledged {value[:12]!r} lost"
                assert reference.log.read(start, end) == value, "acknowledged at other offsets"
            kinds = {e: events.count(e) for e in set(events)}
            terms = max(n.term for n in c.running())
            print(f"nemesis {kinds}; {len(acked)} acknowledged, {len(failed)} failed (unknown outcome), "
                  f"{len(data)} entries committed, {terms} terms")
            assert len(acked) >= 100, "too little progress to mean anything"
            assert sum(kinds.values()) >= 10

    run(main(), timeout=JEPSEN_S + 60)


def test_index_record_layout_is_documented() -> None:
    """The index record is what the log module's docstring draws: 3 x i64, 2 x u32, CRC over the first 28."""
    assert INDEX_RECORD.size == 32
    body = struct.pack("<qqqI", 0, 5, 1, zlib.crc32(b"hello"))
    assert INDEX_RECORD.unpack(body + struct.pack("<I", zlib.crc32(body)))[:3] == (0, 5, 1)
    assert isinstance(LeadershipLostError("x"), ProposalFailedError)
