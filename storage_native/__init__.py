"""The storage core: commit log + consume queues, in C with a pure-Python twin.

``CommitLog``, ``ConsumeQueue``, ``decode_record``, the packed codecs
(``decode_batch``, ``encode_batch``, ``decode_records``) and RocketMQ's encodings
(``encode_rocketmq_records``, ``decode_rocketmq_batch``) come from the C extension
unless it is missing or ``SPARKMQ_STORE_IMPL=python`` forces the twin.  ``IMPL``
says which one is in use; ``implementations()`` gives both for parity tests.
The contract is ``_commitlog.pyi``; the byte formats are ``layout.py``.
"""
from __future__ import annotations

import os
from types import ModuleType

from . import layout
from .errors import StoreError

__all__ = ["CommitLog", "ConsumeQueue", "decode_record", "decode_batch", "encode_batch", "decode_records",
           "encode_rocketmq_records", "decode_rocketmq_batch",
           "v2_send_summary", "pack_v2_send", "encode_v2_send_response", "gc_untrack", "gc_track", "StoreError",
           "IMPL", "implementations", "layout"]

#: Environment variable that selects the implementation: "native" (default) or "python".
IMPL_ENV = "SPARKMQ_STORE_IMPL"


def implementations() -> dict[str, ModuleType]:
    """Every importable implementation by name ("native", "python")."""
    from . import pycommitlog

    found: dict[str, ModuleType] = {"python": pycommitlog}
    try:
        from . import _commitlog
    except ImportError:
        pass
    else:
        found["native"] = _commitlog
    return found


def _select() -> tuple[str, ModuleType]:
    wanted = os.environ.get(IMPL_ENV, "native").strip().lower() or "native"
    if wanted not in ("native", "python"):
        raise ValueError(f"{IMPL_ENV} must be 'native' or 'python', got {wanted!r}")
    available = implementations()
    if wanted == "native" and "native" not in available:
        raise ImportError(
            "the C extension sparkmq.storage_native._commitlog is not built; "
            f"run `python3 build.py setup`, or set {IMPL_ENV}=python to use the slow twin"
        )
    return wanted, available[wanted]


IMPL, _module = _select()
CommitLog = _module.CommitLog
ConsumeQueue = _module.ConsumeQueue
decode_record = _module.decode_record
decode_batch = _module.decode_batch
encode_batch = _module.encode_batch
decode_records = _module.decode_records
#: RocketMQ's encodings (layout.py): a pull's records as RocketMQ's stored messages, a SEND_BATCH_MESSAGE
#: body as a packed batch -- the remoting protocol's hot paths, each one native pass.
encode_rocketmq_records = _module.encode_rocketmq_records
decode_rocketmq_batch = _module.decode_rocketmq_batch
#: RocketMQ 5 SendMessage codecs (the gRPC endpoint's hot path); C only: None with the twin, whose
#: callers then take their per-message path.
v2_send_summary = getattr(_module, "v2_send_summary", None)
pack_v2_send = getattr(_module, "pack_v2_send", None)
encode_v2_send_response = getattr(_module, "encode_v2_send_response", None)


def _keep_tracked(obj: object) -> None:
    """The twin's gc_untrack/gc_track: objects stay in the collector's lists."""


#: ``gc_untrack(obj)`` takes a container out of the garbage collector's lists; ``gc_track(obj)`` puts it back
#: (both no-ops for objects that are not containers or already so).  For objects held in bulk for a short
#: while (a producer's queued messages and their futures): untracked, they are not walked and promoted by
#: every collection meanwhile.  Only sound while the holder keeps the object alive (no cycle through it
#: can be garbage then): call ``gc_track`` before letting go, or a cycle through it would never be freed.
#: The Python twin keeps everything tracked.
gc_untrack = getattr(_module, "gc_untrack", _keep_tracked)
gc_track = getattr(_module, "gc_track", _keep_tracked)
