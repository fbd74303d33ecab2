"""The broker's commit log as a Raft log: :class:`CommitLogRaftLog`.

A DLedger member's Raft entries are the commit log's own bytes.  The store holds the records; an
:class:`~.log.EntryIndex` file beside it (``dledger.index``) says where each entry starts and ends and
its term:

* **Leader, local appends.**  The log is also the store's :class:`~...store.AppendGate`: every ``put``
  (a producer's send over any protocol, a retry, a delayed message coming due, a trace batch) runs
  holding :attr:`CommitLogRaftLog.lock`, is admitted only while this member leads (else
  SERVICE_NOT_AVAILABLE naming the leader), and becomes one entry of the leader's term ending where the
  append ended.  ``on_local_append`` then tells the Raft node there is something to replicate.
* **Leader, no-op.**  A new leader's no-op entry is one record in ``RMQ_SYS_DLEDGER_NOOP`` (no consumer
  subscribes to it).
* **Follower.**  :meth:`CommitLogRaftLog.append_at` writes the leader's records with the store's
  ``append_replicated`` (every record checked, consume queues rebuilt at the leader's queue offsets) and
  :meth:`CommitLogRaftLog.truncate` cuts an uncommitted tail with ``truncate_log``; both hold the lock,
  so no local append runs beside them.  (A follower's gate is shut: its role listener shuts it under the
  lock in the same step that ends its leadership.)

What is persisted when: the records go to the log first and the index record second, both before the
node acknowledges or replicates them.  Opening reconciles the two: index records past the log's end are
dropped, and log bytes past the last indexed entry are cut (a leader killed between the two writes;
such records were never replicated, so never committed).
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from ...common.errors import ErrorCode, SparkMQError
from ...common.message import Message
from ...common.system_topics import DLEDGER_NOOP_TOPIC
from ...store import MessageStore
from .log import EntryIndex

__all__ = ["CommitLogRaftLog", "INDEX_FILE_NAME"]

log = logging.getLogger("sparkmq.dledger")

#: The entry index, in the member's DLedger directory.
INDEX_FILE_NAME = "dledger.index"


class CommitLogRaftLog:
    """A :class:`~.log.RaftLog` over a :class:`MessageStore`, and that store's append gate.

    ``refusal()`` words the error a refused local append gets (who leads now); ``accepting()`` may
    refuse appends while the member leads (a leadership transfer in progress).  Thread-safe: every
    method holds :attr:`lock`.
    """

    def __init__(self, store: MessageStore, directory: str | os.PathLike[str], *,
                 refusal: Callable[[], str] = lambda: "this broker does not lead its DLedger group",
                 accepting: Callable[[], bool] = lambda: True, fsync: bool = False) -> None:
        """Open (or create) the index in ``directory`` and reconcile it with the started ``store``.

        Raises ``SparkMQError`` (INVALID_ARGUMENT) for a store holding records no index names: a DLedger
        member starts on an empty store or on its own.
        """
        self.store = store
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self._refusal = refusal
        self._accepting = accepting
        #: The term local appends join (this member leads), None while it does not.
        self._writable_term: int | None = None
        #: The term of the no-op being appended (it bypasses the writable check).
        self._noop_term: int | None = None
        #: Called after each admitted local append (the node replicates it); not for the no-op.
        self.on_local_append: Callable[[], None] | None = None
        #: Log bytes cut at open past the last indexed entry.
        self.recovered_cut_bytes = 0
        self.index = EntryIndex(self.directory / INDEX_FILE_NAME, fsync=fsync)
        try:
            self._reconcile()
        except BaseException:
            self.index.close()
            raise
        store.set_append_gate(self)

    def _reconcile(self) -> None:
        offsets = self.store.log_offsets()
        index = self.index
        if not len(index) and offsets.max_offset > 0:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"the store under {self.directory.parent} holds {offsets.max_offset} bytes that no "
                               f"DLedger index names: a DLedger member starts on an empty store")
        keep = index.keep_count(offsets.max_offset)
        if keep != len(index):
            log.warning("dledger: the index names entries up to %d, the log ends at %d: dropping %d entries",
                        index.end, offsets.max_offset, len(index) - keep)
            index.cut(keep)
        if offsets.max_offset > index.end:
            self.recovered_cut_bytes = offsets.max_offset - index.end
            log.warning("dledger: cutting %d log bytes past the last indexed entry (%d)", self.recovered_cut_bytes,
                        index.end)
            self.store.truncate_log(index.end)

    def close(self) -> None:
        """Lift the gate and close the index."""
        with self.lock:
            self.store.set_append_gate(None)
            self.index.close()

    # -- the gate -------------------------------------------------------------------------------
    def set_writable(self, term: int | None) -> None:
        """Admit local appends as entries of ``term`` (this member leads it), or none (None)."""
        with self.lock:
            self._writable_term = term

    @property
    def writable_term(self) -> int | None:
        """The term local appends join; None while they are refused."""
        return self._writable_term

    def admit(self) -> int:
        """The store's gate: the term of the entry an append will be (else SERVICE_NOT_AVAILABLE)."""
        if self._noop_term is not None:
            return self._noop_term
        term = self._writable_term
        if term is None or not self._accepting():
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, self._refusal())
        return term

    def appended(self, token: int, end_offset: int) -> None:
        """The store's gate: an admitted append ended at ``end_offset``; it is an entry of term ``token``."""
        self.index.add(self.index.end, end_offset, token)
        if self._noop_term is None and self.on_local_append is not None:
            self.on_local_append()

    # -- RaftLog --------------------------------------------------------------------------------
    def last(self) -> tuple[int, int]:
        """``(end offset, term of the last entry)``."""
        with self.lock:
            return self.index.last()

    def append(self, term: int, data: bytes) -> tuple[int, int]:
        """The leader's no-op entry: one record in the no-op topic with ``data`` as its body."""
        with self.lock:
            self._noop_term = term
            try:
                self.store.put(Message(DLEDGER_NOOP_TOPIC, data), 0, wait=False)
            finally:
                self._noop_term = None
            return self.index.starts[-1], self.index.ends[-1]

    def append_at(self, start: int, term: int, data: bytes) -> None:
        """A follower: the leader's records ``data`` as one entry at ``start`` (the log's end)."""
        with self.lock:
            if start != self.index.end:
                raise ValueError(f"append at {start}, but the log ends at {self.index.end}")
            end = self.store.append_replicated(start, data, notify=False)  # the commit tells, see DLedgerMember
            self.index.add(start, end, term)

    def entries_from(self, offset: int, max_bytes: int) -> list[tuple[int, int, bytes]]:
        """Whole entries ``(start, term, records)`` from boundary ``offset``, about ``max_bytes`` of them."""
        with self.lock:
            index = self.index
            span = index.span_from(offset, max_bytes)
            if not span:
                return []
            end = index.ends[span[-1]]
            chunks = []
            at = offset
            while at < end:  # the store answers whole records, at most what is asked: read until the span ends
                chunk = self.store.read_replication(at, end - at)
                chunks.append(chunk)
                at += len(chunk)
            blob = b"".join(chunks) if len(chunks) > 1 else chunks[0]
            return [(index.starts[k], index.terms[k], blob[index.starts[k] - offset:index.ends[k] - offset])
                    for k in span]

    def term_at(self, offset: int) -> int | None:
        """The term of the entry ending at ``offset`` (0 at the start, None inside an entry or past the end)."""
        with self.lock:
            return self.index.term_at(offset)

    def entry_boundary(self, offset: int) -> int:
        """The greatest entry end at or below ``offset``."""
        with self.lock:
            return self.index.entry_boundary(offset)

    def truncate(self, offset: int) -> None:
        """Drop every entry from boundary ``offset`` on: the index first, then the log (a crash between the
        two leaves log bytes past the index, which the next open cuts)."""
        with self.lock:
            if self.index.term_at(offset) is None:
                raise ValueError(f"truncate at {offset}: not an entry boundary of this log")
            self.index.cut(self.index.keep_count(offset))
            self.store.truncate_log(offset)

    def __len__(self) -> int:
        return len(self.index)
