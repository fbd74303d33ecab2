"""A Raft node's persisted state: its current term and whom it voted for in that term.

Raft's election safety rests on a node never voting twice in one term and never going back to an
older term, across restarts.  So both are written to disk, atomically, *before* they count: before a
vote is granted (the reply leaves after :meth:`RaftState.save` returned), before a candidate asks for
votes, before a higher term seen in a message is adopted.  The file is replaced whole::

    raft-state.json   {"format": "sparkmq-raft-state", "version": 1, "term": <int>, "voted_for": <id or null>}

A save writes ``raft-state.json.tmp``, fsyncs it, renames it over ``raft-state.json`` and fsyncs the
directory, so after a crash the file holds either the old state or the new one, never a mix.  The
in-memory values change only after the rename is durable.  A file that does not decode is one
``STORE_CORRUPT`` error: starting over at term 0 could vote twice, so it is never reset silently.
"""
from __future__ import annotations

import os
from pathlib import Path

import msgspec

from ...common.durable_file import replace_durably
from ...common.errors import ErrorCode, SparkMQError

__all__ = ["STATE_FILE", "RaftState"]

STATE_FILE = "raft-state.json"
_FORMAT = "sparkmq-raft-state"
_VERSION = 1


class _StateRecord(msgspec.Struct, forbid_unknown_fields=True):
    format: str
    version: int
    term: int
    voted_for: str | None


class RaftState:
    """``term`` and ``voted_for`` of one node, kept in ``directory/raft-state.json``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / STATE_FILE
        #: The latest term this node has seen (0 before any).
        self.term = 0
        #: The candidate this node voted for in ``term``, or None.
        self.voted_for: str | None = None
        #: Saves so far (each one is a fsync'd rename).
        self.saves = 0
        self._load()

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            record = msgspec.json.decode(raw, type=_StateRecord)
        except msgspec.DecodeError as exc:
            raise SparkMQError(ErrorCode.STORE_CORRUPT, f"raft state {self.path} does not decode: {exc}") from None
        if record.format != _FORMAT or record.version != _VERSION or record.term < 0:
            raise SparkMQError(ErrorCode.STORE_CORRUPT,
                               f"raft state {self.path}: format {record.format!r} v{record.version}, "
                               f"term {record.term}")
        self.term, self.voted_for = record.term, record.voted_for

    def save(self, term: int, voted_for: str | None) -> None:
        """Make ``(term, voted_for)`` durable, then current.  A term never goes back (``ValueError``)."""
        if term < self.term:
            raise ValueError(f"term {term} is below the persisted term {self.term}")
        if term == self.term and voted_for != self.voted_for and self.voted_for is not None:
            raise ValueError(f"already voted for {self.voted_for} in term {term}")
        data = msgspec.json.encode(_StateRecord(_FORMAT, _VERSION, term, voted_for))
        replace_durably(self.path, data)
        self.term, self.voted_for = term, voted_for
        self.saves += 1

    def __repr__(self) -> str:
        return f"RaftState(term={self.term}, voted_for={self.voted_for!r})"
