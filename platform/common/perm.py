"""Topic permission bits, with RocketMQ's meaning (``PermName``).

=====  =========  ==================================================================
bit    name       meaning when set
=====  =========  ==================================================================
4      READ       consumers may pull from the topic's queues on this broker
2      WRITE      producers may send to the topic's queues on this broker
1      INHERIT    the topic's config may be copied by auto-create (template topics)
=====  =========  ==================================================================

So ``perm`` 6 = read + write (the default), 4 = read only (sends rejected with
NO_PERMISSION), 2 = write only (pulls rejected), 0 = neither; 7 adds INHERIT.
"""
from __future__ import annotations

__all__ = ["PERM_READ", "PERM_WRITE", "PERM_INHERIT", "PERM_READ_WRITE", "PERM_MAX",
           "is_readable", "is_writeable", "is_inherited", "perm_to_string"]

PERM_READ = 1 << 2
PERM_WRITE = 1 << 1
PERM_INHERIT = 1 << 0
#: The default perm of a topic.
PERM_READ_WRITE = PERM_READ | PERM_WRITE
#: The largest meaningful perm value (all bits).
PERM_MAX = PERM_READ | PERM_WRITE | PERM_INHERIT


def is_readable(perm: int) -> bool:
    """Whether ``perm`` lets consumers pull (``is_readable(6) -> True``, ``is_readable(2) -> False``)."""
    return bool(perm & PERM_READ)


def is_writeable(perm: int) -> bool:
    """Whether ``perm`` lets producers send (``is_writeable(6) -> True``, ``is_writeable(4) -> False``)."""
    return bool(perm & PERM_WRITE)


def is_inherited(perm: int) -> bool:
    """Whether ``perm`` carries the INHERIT bit."""
    return bool(perm & PERM_INHERIT)


def perm_to_string(perm: int) -> str:
    """RocketMQ's ``RWX`` rendering: ``perm_to_string(6) -> 'RW-'``, ``perm_to_string(4) -> 'R--'``."""
    return ("R" if is_readable(perm) else "-") + ("W" if is_writeable(perm) else "-") + \
        ("X" if is_inherited(perm) else "-")
