"""Replacing a small file so that after a crash it holds the old contents or the new ones, never a mix.

The tables a service keeps as one file (topics, subscription groups, KV configs, the ACL, a Raft node's term
and vote) are rewritten whole on every change: a temporary file beside it is written and fsync'd, renamed over
it, and the directory fsync'd so the rename itself survives a power loss.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["replace_durably"]


def replace_durably(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Make ``data`` the contents of ``path`` atomically and durably (its folder is created when missing);
    ``mode`` applies to a newly created file (0o600 for secrets).  Raises OSError; ``path`` is then unchanged."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
